"""The web tier's side of the relay (core/relay.py): tickets, calls to a node's relay, and the session cap.

Callers have already authorized the user (the instance's owner). ``relay_target``
signs a ticket for one operation on the instance's container and says where
its node's relay is; ``refusal`` turns the relay's error answer into the
ServiceError to raise here. ``SessionSlot`` holds one of the user's
RELAY_MAX_SESSIONS_PER_USER concurrent terminal and file sessions, counted in
Redis so that the cap holds across every web server and host: a slot is a lease
renewed while the session lives, so a crashed server's slots come back by
themselves. Leases run on Redis's clock, not this machine's. ``terminals_revoke`` closes
a user's open terminals when their access ends.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import NamedTuple

import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction

from core import messages
from core.clients import redis_client
from core.errors import Conflict, InvalidInput, ServiceError, TooMany
from core.relay import Op, Ticket, relay_base, ticket_sign, within
from core.relay_tls import wrong_certificate
from scheduler.models import Node, Workload, WorkloadKind, WorkloadStatus

log = logging.getLogger(__name__)
CONNECT_S = 5
IDLE_S = 60  # the longest wait for the relay's next bytes
LEASE_S = 60  # a session slot not renewed for this long is free again
RENEW_S = LEASE_S / 3


class RelayTarget(NamedTuple):
    """One relay call: where, its ticket's header, and the relay's registered certificate (``core.relay_tls``)."""

    url: str
    headers: dict
    tls_sha256: str


def relay_target(*, workload: Workload, user, op: Op, **params) -> RelayTarget:
    """One relay call for ``workload``'s container; Conflict if it cannot be made now."""
    ended = False
    if workload.status != WorkloadStatus.RUNNING:
        # A job that has ended keeps its disk until it is released: its files can be listed and downloaded.
        ended_job = workload.kind == WorkloadKind.JOB and workload.status in WorkloadStatus.ended_job()
        if not (op in (Op.LIST, Op.DOWNLOAD) and ended_job):
            raise Conflict(not_running(workload))
        ended = True
        if not within(params.get("path", ""), settings.JOB_CHECKPOINT_PATH):
            raise InvalidInput(
                f"once a job has ended only its disk, {settings.JOB_CHECKPOINT_PATH}, is left on its host (until "
                "it is released); keep what you need afterwards in /root/autodl-fs",
                field="path",
            )
    node = workload.node
    if node is None or not node.relay_url:
        raise Conflict("the instance's host has no relay registered: its node agent must be restarted")
    base = relay_base_of(node)
    ticket = Ticket(op=op, container=workload.container_name, workload=workload.pk, user=user.pk, ended=ended, **params)
    token = ticket_sign(ticket)
    return RelayTarget(f"{base}/v1/{op}", {"Authorization": f"Bearer {token}"}, node.relay_tls_sha256)


def terminals_revoke(*, user_id: int, reason: str, team: str | None = None) -> None:
    """Once this transaction commits, close the user's open terminals: all of them, or with ``team`` those of work
    charged to that team. A terminal's relay session is checked once, when it opens; this ends it sooner."""
    event = {"type": messages.TERMINAL_REVOKE, "reason": reason, "team": team}

    def send():
        async_to_sync(get_channel_layer().group_send)(messages.terminals_group(user_id), event)

    transaction.on_commit(send, robust=True)  # the change stands without Redis; the terminal lives to its limit


def relay_base_of(node: Node) -> str:
    """Where ``node``'s relay answers; Conflict if its relay URL is not at its registered address, or it serves
    TLS without a registered certificate (nothing is called: a host writes its own relay URL, and a compromised
    one could point the web tier anywhere)."""
    try:
        return relay_base(
            node=node.name, address=node.address, relay_url=node.relay_url, tls_sha256=node.relay_tls_sha256
        )
    except ValueError as exc:
        log.error("relay refused before the call: %s", exc)
        raise Conflict(str(exc)) from None


def not_running(workload: Workload) -> str:
    """Why a terminal or files of ``workload`` cannot be had now, and what the user can do instead."""
    status = workload.status
    if workload.kind == WorkloadKind.JOB:
        if status in (WorkloadStatus.QUEUED, WorkloadStatus.STARTING):
            return f"a job's terminal and files can be reached while it runs; this one is {status}"
        if status not in WorkloadStatus.ended_job():
            return (
                f"this job is {status}: its container and disks are gone with it. Keep what you need in "
                "/root/autodl-fs, your file storage, which every job and instance you run mounts"
            )
        return (
            f"a job's terminal and uploads work while it runs; this one has ended ({status}). Its files can "
            "still be listed and downloaded until it is released; keep what you need afterwards in "
            "/root/autodl-fs, your file storage, which every job and instance you run mounts"
        )
    hint = ": start it (with or without a GPU)" if status == WorkloadStatus.STOPPED else ""
    return f"an instance's terminal and files can be reached while it runs; this one is {status}{hint}"


def refusal(status: int, body: bytes) -> ServiceError:
    """The error to raise for a relay's answer ``status`` (not 2xx) with JSON ``body``."""
    try:
        answer = json.loads(body)
        detail = str(answer["detail"])
    except (ValueError, KeyError, TypeError):
        answer, detail = {}, f"the instance's host answered {status}"
    field = next((key for key in answer if key != "detail"), None)
    if status == 400:
        return InvalidInput(detail, field=field)
    if status in (409, 504):  # not running; took too long
        return Conflict(detail)
    if status == 404:
        return Conflict("the instance's container is not on its host")
    if status == 429:  # the host's relay is busy, or this user holds his share of it
        return TooMany(detail)
    # 401 / 403: the host does not hold the control plane's relay.pub (or a clock is far off); 5xx: a fault.
    log.error("relay refused a call: %s %s", status, detail)
    return Conflict(f"the instance's host refused: {detail}")


def unreachable(exc: Exception) -> Conflict:
    if wrong_certificate(exc):  # someone else answered at the host's address, or the host was re-keyed behind us
        log.error("relay refused: %s", exc)
        return Conflict("the instance's host did not present the certificate it registered; tell an operator")
    log.warning("relay unreachable: %s", exc)
    return Conflict("the instance's host does not answer; try again in a moment")


# KEYS[1]: the user's sessions (a sorted set, member -> lease end in ms on Redis's clock).
# ARGV: member, cap, lease in ms. Takes or renews the member's slot; 0 if the cap is reached.
_TAKE = """
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
"""
# The same keys and lease; extends the member's lease only if it still holds one (never after a release).
_RENEW = """
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
"""


class SessionSlot:
    """One of the user's concurrent terminal / file sessions: ``take()``, ``renew()`` every RENEW_S, ``release()``.

    A subclass counts another kind of session against its own cap (``pool``, ``limit``).
    """

    pool = "relay-sessions"

    def __init__(self, user_id: int):
        self.key = f"gpucloud:{settings.DEPLOYMENT_ID}:{self.pool}:{user_id}"
        self.member = uuid.uuid4().hex

    def limit(self) -> tuple[int, str]:
        """The cap, and the sentence that refuses one more."""
        cap = settings.RELAY_MAX_SESSIONS_PER_USER
        return cap, f"you have {cap} terminal and file sessions open, the most at once: close one first"

    def take(self) -> SessionSlot:
        cap, refused = self.limit()
        if not redis_client().eval(_TAKE, 1, self.key, self.member, cap, LEASE_S * 1000):
            raise TooMany(refused)
        return self

    def renew(self) -> None:
        try:
            redis_client().eval(_RENEW, 1, self.key, self.member, LEASE_S * 1000)
        except redis.RedisError as exc:  # the session goes on; its lease may lapse meanwhile
            log.warning("could not renew a relay session lease: %s", exc)

    def release(self) -> None:
        try:
            redis_client().zrem(self.key, self.member)
        except redis.RedisError as exc:  # the lease lapses by itself
            log.warning("could not release a relay session lease: %s", exc)

    def __enter__(self) -> SessionSlot:
        return self.take()

    def __exit__(self, *exc) -> None:
        self.release()
