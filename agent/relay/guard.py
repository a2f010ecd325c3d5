"""What the relay checks before any handler runs: the ticket, and that the container is one of this node's.

``Guard.admit`` answers 401 for a missing, forged, expired or already used
ticket, 403 for a ticket of another operation or one whose path leaves its
root, 404 for a container that is not there, 403 for one of another node or
deployment (or whose labels name another workload or owner than the ticket),
and 409 for one that does not run. A log is the workload's, read from this host's files whatever
became of its container: 404 when there is none here, 403 when another owner's or deployment's.
It returns a ``Call``: what a handler needs.

A call's blocking work runs on the relay's THREADS threads (``Threads``), shared out: one user holds at
most RELAY_MAX_SESSIONS_PER_USER of them at once, and work never waits for one: beyond either, 429. A
thread is counted until its work has really ended, not when its HTTP side gave up, so a tenant whose
calls hang (his container answers Docker slowly, or never) holds his own share and no one else's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import posixpath
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import docker
from django.conf import settings

from agent import worklogs
from agent.launcher import LABEL
from core.relay import FILE_ROOTS, Op, Ticket, TicketRefused, same_host, ticket_open, verify_keys, within


class Refused(Exception):
    """A request the relay will not serve: answered with ``status`` and ``{"detail": message}``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


THREADS = 64  # blocking Docker calls in flight at once (a transfer holds one for its whole length)


class Threads:
    """The relay's worker threads, counted per user: ``run`` refuses (429) rather than queue behind busy ones."""

    def __init__(self, executor: Executor):
        self._executor = executor
        self._lock = threading.Lock()  # the counts drop on the worker threads, as each piece of work ends
        self._busy = 0
        self._by_user: dict[int, int] = {}

    def run(self, user: int, function: Callable) -> asyncio.Future:
        """``function()`` on a thread of its own, started now, counted for ``user`` until it has returned."""
        with self._lock:
            if self._busy >= THREADS:
                raise Refused(429, "this host's relay is busy: try again in a moment")
            cap = settings.RELAY_MAX_SESSIONS_PER_USER
            if self._by_user.get(user, 0) >= cap:
                raise Refused(429, f"you have {cap} file, terminal and log calls at once on this host: wait for one")
            self._busy += 1
            self._by_user[user] = self._by_user.get(user, 0) + 1
        future = self._executor.submit(function)
        future.add_done_callback(lambda _: self._done(user))
        return asyncio.wrap_future(future)

    def _done(self, user: int) -> None:
        with self._lock:
            self._busy -= 1
            self._by_user[user] -= 1
            if not self._by_user[user]:
                del self._by_user[user]


@dataclass
class Call:
    """One admitted request: its ticket, the Docker API, and how to run a blocking call off the event loop."""

    ticket: Ticket
    api: docker.APIClient
    threads: Threads
    ended: EndedJob | None = None  # a ticket for an ended job's files: what is left of it here

    def run(self, function: Callable, *args, **kwargs) -> asyncio.Future:
        """``function(*args, **kwargs)`` on the relay's threads, started now; await the result (Refused: 429)."""
        return self.threads.run(self.ticket.user, functools.partial(function, *args, **kwargs))


class Guard:
    def __init__(self, *, node: str, deployment: str, state_dir: Path | None = None):
        self.node, self.deployment = node, deployment
        self.keys = verify_keys()  # ImproperlyConfigured now, at the agent's start, if the host has none
        self._spent = SpentTickets(Path(state_dir or settings.AGENT_STATE_DIR) / node / "relay-spent-tickets")

    async def admit(self, request, op: Op, *, api: docker.APIClient, threads: Threads) -> Call:
        ticket = self._ticket(request.headers.get("Authorization", ""), op, remote=request.remote or "")
        call = Call(ticket, api, threads)
        if op == Op.LOGS:  # the log outlives the container: its files say whose it is
            meta = await call.run(worklogs.meta_read, ticket.workload)
            if meta is None:
                raise Refused(404, f"no log of workload {ticket.workload} on this node")
            if meta.get("deployment") != self.deployment or meta.get("owner") != ticket.user:
                raise Refused(403, f"the log of workload {ticket.workload} is not this ticket's")
            return call
        if ticket.ended:  # a job's files after it ended: its container is gone, its disk stays until released
            if op not in (Op.LIST, Op.DOWNLOAD):
                raise Refused(403, "an ended job's files can be listed and downloaded, nothing more")
            call.ended = await call.run(ended_job, api, ticket, self.node, self.deployment)
            return call
        labels, running = await call.run(_container_state, api, ticket.container)
        if labels is None:
            raise Refused(404, f"no container {ticket.container} on this node")
        expected = {
            f"{LABEL}.node": self.node,
            f"{LABEL}.deployment": self.deployment,
            f"{LABEL}.workload": str(ticket.workload),
            f"{LABEL}.owner": str(ticket.user),
        }
        if any(labels.get(key) != value for key, value in expected.items()):
            raise Refused(403, f"{ticket.container} is not a container of this node's for this ticket")
        if op == Op.VOLUME:
            if running:
                raise Refused(409, "the instance runs: its disk is copied only while it is stopped")
        elif not running:
            raise Refused(409, "the instance is not running")
        return call

    def _ticket(self, header: str, op: Op, *, remote: str = "") -> Ticket:
        scheme, _, token = header.partition(" ")
        if scheme != "Bearer" or not token:
            raise Refused(401, "a relay ticket is required (Authorization: Bearer ...)")
        try:
            ticket, until = ticket_open(token, keys=self.keys)
        except TicketRefused as exc:
            raise Refused(401, str(exc)) from None
        if ticket.op != op:
            raise Refused(403, f"the ticket is for {ticket.op}, not {op}")
        if op in (Op.LIST, Op.DOWNLOAD, Op.UPLOAD) and not (
            ticket.root in FILE_ROOTS
            and posixpath.normpath(ticket.path) == ticket.path
            and within(ticket.path, ticket.root)
        ):
            raise Refused(403, "the ticket's path is not under its root")
        if ticket.peer and not same_host(remote, ticket.peer):  # before it is spent: the caller cannot use it up
            raise Refused(403, f"the ticket is for the host at {ticket.peer}, not {remote or 'this caller'}")
        if not self._spent.spend(ticket.nonce, until):
            raise Refused(401, "the ticket was used already")
        return ticket


class SpentTickets:
    """The nonces of tickets used and not yet expired, also on disk: a ticket is good for one request, even
    across a restart of the agent (its file is read back at start). Kept by the wall clock, which is what a
    ticket's age is measured by."""

    def __init__(self, path: Path):
        self.path = path
        self._until: dict[str, float] = {}  # nonce -> when it may be forgotten (it has expired by then)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            for line in path.read_text().splitlines():
                until, _, nonce = line.partition(" ")
                with contextlib.suppress(ValueError):
                    self._until[nonce] = float(until)
        except FileNotFoundError:
            pass
        self._forget(time.time())

    def spend(self, nonce: str, expires: float) -> bool:
        """True the first time ``nonce`` is seen (it is recorded until its ticket ``expires``, on disk too), False
        after."""
        now = time.time()
        if self._appended >= 256:  # the file holds mostly expired lines by now
            self._forget(now)
        if self._until.get(nonce, 0) > now:
            return False
        self._until[nonce] = until = expires + 5
        with open(self.path, "a") as f:  # a restart of the agent finds it (a power loss may lose the last lines)
            f.write(f"{until:.0f} {nonce}\n")
        self._appended += 1
        return True

    def _forget(self, now: float) -> None:
        """Drop expired nonces, and rewrite the file with the rest (atomically: a crash keeps one or the other)."""
        self._until = {nonce: until for nonce, until in self._until.items() if until > now}
        self._appended = 0
        partial = self.path.with_suffix(".new")
        partial.write_text("".join(f"{until:.0f} {nonce}\n" for nonce, until in self._until.items()))
        os.replace(partial, self.path)


STARTED = "relay.started"


async def start(request, response):
    """Prepare ``response`` (its status and headers go out) and note it: a later failure can only cut it short."""
    await response.prepare(request)
    request[STARTED] = response
    return response


@dataclass(frozen=True)
class EndedJob:
    volume: str  # its disk, mounted at JOB_CHECKPOINT_PATH while it ran
    image: str  # the image it ran (on this host since)


def ended_job(api: docker.APIClient, ticket: Ticket, node: str, deployment: str) -> EndedJob:
    """The ticket's job if it has ended on this node and is its owner's, with its disk here; Refused if not."""
    from django.db import connection

    from scheduler.models import Workload, WorkloadKind, WorkloadStatus

    try:
        workload = (
            Workload.objects.filter(pk=ticket.workload, kind=WorkloadKind.JOB, node__name=node)
            .only("uid", "owner_id", "status", "image_ref")
            .first()
        )
    finally:
        connection.close()  # the relay's threads hold no connection between calls
    if workload is None or workload.owner_id != ticket.user:
        raise Refused(404, f"no job {ticket.workload} of this ticket's owner on this node")
    if workload.status not in WorkloadStatus.ended_job():
        raise Refused(409, f"the job is {workload.status}: ask for its files again")
    try:
        labels = api.inspect_volume(workload.volume_name).get("Labels") or {}
    except docker.errors.NotFound:
        raise Refused(404, "the job's disk is not on this node") from None
    expected = {f"{LABEL}.node": node, f"{LABEL}.deployment": deployment, f"{LABEL}.uid": workload.uid}
    if any(labels.get(key) != value for key, value in expected.items()):
        raise Refused(403, f"{workload.volume_name} is not this node's disk of job {ticket.workload}")
    return EndedJob(volume=workload.volume_name, image=workload.image_ref)


def _container_state(api: docker.APIClient, name: str) -> tuple[dict | None, bool]:
    try:
        attrs = api.inspect_container(name)
    except docker.errors.NotFound:
        return None, False
    return attrs["Config"].get("Labels") or {}, bool(attrs["State"].get("Running"))
