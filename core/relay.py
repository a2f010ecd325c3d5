"""The relay's contract: how the web tier reaches a container's shell, files and logs through its host's agent.

The web tier (gunicorn, daphne) never talks to a Docker engine. Once it has
authorized the user (the instance's owner), it signs a ticket naming one
operation on one container and calls the relay of the node that holds it
(``Node.relay_url``, held to the node's registered address: ``relay_base``; served by
``agent/relay/``), which checks the ticket and the container's labels before it touches Docker.

    operation   relay route                  body                      web side
    terminal    GET /v1/terminal  WebSocket  the browser's frames       portal/sockets/terminal.py
    list        GET /v1/list                 NDJSON, one entry a line   portal/services/files.py
    download    GET /v1/download             the file's bytes           portal/services/files.py
    upload      PUT /v1/upload               the file's bytes (chunked) portal/services/files.py
    volume      GET /v1/volume               a tar of the data disk     another host's agent, moving
                                             of a STOPPED instance      the instance (agent/moves.py)
    logs        GET /v1/logs                 NDJSON: one log line a     portal/services/logs.py
                                             line, then {"piece": ...}

Logs are the workload's, not a container's: they outlive it (``agent/worklogs.py``), so
the relay checks the owner and deployment its own log files record instead of a container's
labels. A ticket for logs names the run (one start of the container, ``WorkloadRun``) and what to
read: lines after ``after`` (a sequence number within the run), the last ``tail``, those at or
after ``since`` (the wire's time format), and ``follow``: keep the answer open and send lines as
they are collected until the run's output ends. The answer ends with
``{"piece": {"finished": bool, "exit_code": int|null, "seq": <last seq>, "kept_bytes", "dropped_bytes"}}``
(an answer without it was cut short); while following, ``{}`` lines keep the connection alive.

A ticket travels as ``Authorization: Bearer <ticket>``. It is signed with an Ed25519 key only the
control plane holds (``RELAY_SIGNING_KEY``: web servers and the scheduler's worker); a GPU host holds
the public half (``RELAY_VERIFY_KEY``, one or more keys: a new one can be added before the old one
goes), so a host checks tickets and cannot make one — not for its own containers, not for another
host's. A ticket is valid for its ``ttl`` (at most TICKET_S seconds; a move's VOLUME capability,
issued by the control plane to the target host for that one move, at most VOLUME_TICKET_S) by the
relay's clock from when it was issued, and good for one request, also across a restart of the agent.
A move's capability also names the target's registered address (``peer``): the source's relay takes it
from there only, so one read from the queue by another host is refused. A ticket carries every
parameter of the operation (the path, the upload's name and size), so the relay reads nothing the
control plane did not sign. Errors come back as the API shapes them:
``{"detail": ..., "<field>": [...]}`` with 400, 404 or 409; 401 / 403 for a ticket the relay refuses.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import posixpath
import re
import secrets
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from urllib.parse import urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signing import b64_decode, b64_encode

CONTEXT = b"gpucloud.relay.v2."  # signed before the ticket: a signature made for anything else does not fit
TICKET_S = 60
# A move's VOLUME capability waits in the target's queue and may be used once the target gets to it: as long
# as the control plane waits for the move's next report before failing it.
VOLUME_TICKET_S = settings.MOVE_STALL_S
CLOCK_SKEW_S = 30  # a ticket issued up to this far in the relay's future (the clocks differ a little)
# Where the files pages may go, the default first: the data disk, the user's shared storage, the
# system disk (the rest of /root), as the launcher mounts them. A path belongs to the most specific
# one; a symbolic link that leads out of it is not followed.
HOME = "/root"
FILE_ROOTS = (settings.INSTANCE_DATA_PATH, settings.SHARED_FS_PATH, HOME)
# A node registered without an address is on this machine (tests): its relay answers on loopback.
LOOPBACK = "127.0.0.1"
SHA256_HEX = re.compile(r"[0-9a-f]{64}")  # a relay certificate's fingerprint, as registered
# Close code of the relay's terminal socket when the shell ends (the browser sees the same). When the
# shell exited (rather than the container stopping or the session's time running out), the last frame
# before that close is the text frame {"exit_code": N}: the CLI's ``exec`` exits with N.
SHELL_ENDED = 4000


class Op(StrEnum):
    TERMINAL = "terminal"
    LIST = "list"
    DOWNLOAD = "download"
    UPLOAD = "upload"
    VOLUME = "volume"  # agent to agent: the data disk of a stopped instance that moves to the caller's host
    LOGS = "logs"  # a workload's stored output on this host (its container may be gone)


@dataclass(frozen=True)
class Ticket:
    op: Op
    container: str
    workload: int
    user: int
    root: str = ""
    path: str = ""
    name: str = ""  # upload: the new file's name in ``path``
    size: int = 0  # upload: its length in bytes
    move: int = 0  # volume: the Move it serves (the relay reports what it sent to the control plane)
    peer: str = ""  # volume: the address the move's target calls from (its registered one); empty: any
    run: int = 0  # logs: which run's piece, its lines after ``after`` (a seq), the last ``tail``, from ``since``
    after: int = 0
    tail: int = 0
    since: str = ""
    follow: bool = False
    ended: bool = False  # list, download: a job that has ended (its container stopped, kept until it is released)
    nonce: str = field(default_factory=lambda: secrets.token_urlsafe(12))


def relay_base(*, node: str, address: str, relay_url: str, tls_sha256: str = "") -> str:
    """Where node ``node``'s relay answers, ``scheme://host:port``: its ``relay_url`` if that is http(s) at
    the node's registered ``address`` with a port and nothing after but "/", https with the SHA-256 of the
    certificate it registered (``tls_sha256``, what callers pin: ``core.relay_tls``) and http without one;
    ValueError naming the node if not.

    A host's agent writes its own relay URL, and the web tier and the other hosts call whatever it names
    (``http://169.254.169.254/latest/meta-data#`` would swallow the call's path): the URL is checked where it
    is used, and the call's path is always the caller's own. A host that serves TLS always says with which
    certificate, and one that registered a certificate is never called in the clear.
    """
    registered = address.strip("[]") or LOOPBACK
    refused = ValueError(f"host {node}'s relay address {relay_url!r} is not its registered address {registered}")
    try:
        parts = urlsplit(relay_url)
        port = parts.port
    except ValueError:
        raise refused from None
    if (
        parts.scheme not in ("http", "https")
        or port is None
        or "@" in parts.netloc
        or parts.path not in ("", "/")
        or "?" in relay_url
        or "#" in relay_url
        or not same_host(parts.hostname or "", registered)
    ):
        raise refused
    if parts.scheme == "https" and not SHA256_HEX.fullmatch(tls_sha256):
        raise ValueError(f"host {node}'s relay serves TLS but registered no certificate fingerprint")
    if parts.scheme == "http" and tls_sha256:
        raise ValueError(f"host {node}'s relay registered a certificate but is not called over TLS ({relay_url})")
    host = parts.hostname
    return f"{parts.scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def same_host(one: str, other: str) -> bool:
    """Whether two addresses (an IPv4 one also as IPv6-mapped) or two names (in any case) are the same host's."""
    try:
        first, second = (ipaddress.ip_address(a.strip("[]")) for a in (one, other))
    except ValueError:  # a name (either one): the same name, in any case
        return one.rstrip(".").lower() == other.rstrip(".").lower()
    return _unmapped(first) == _unmapped(second)


def _unmapped(address):
    return getattr(address, "ipv4_mapped", None) or address


class TicketRefused(Exception):
    """The relay does not take this ticket (the message says why: it is shown to the caller)."""


class TicketExpired(TicketRefused):
    pass


def ticket_sign(ticket: Ticket, *, ttl: int = TICKET_S, key: Ed25519PrivateKey | None = None) -> str:
    """``ticket`` as a bearer token: valid ``ttl`` seconds from now, signed with ``key`` (the control plane's)."""
    payload = asdict(ticket) | {"iat": int(time.time()), "ttl": ttl}
    body = b64_encode(json.dumps(payload, separators=(",", ":")).encode())
    return f"{body.decode()}.{b64_encode((key or signing_key()).sign(CONTEXT + body)).decode()}"


def ticket_open(token: str, *, keys: tuple[Ed25519PublicKey, ...] | None = None) -> tuple[Ticket, float]:
    """The ticket ``token`` holds and when it expires (this clock's time), if one of ``keys`` (the configured
    verify keys) signed it, its time to live is one its operation may have, and it is still valid;
    TicketExpired or TicketRefused if not."""
    invalid = TicketRefused("the ticket is not valid")
    body, _, signature = token.partition(".")
    try:
        signed, fields = CONTEXT + body.encode("ascii"), json.loads(b64_decode(body.encode("ascii")))
        signature = b64_decode(signature.encode("ascii"))
    except ValueError:  # not ASCII, not base64 (binascii.Error), not JSON: each a ValueError
        raise invalid from None
    if not any(_verifies(key, signature, signed) for key in keys or verify_keys()):
        raise invalid
    try:
        issued, ttl = int(fields.pop("iat")), int(fields.pop("ttl"))
        ticket = Ticket(**fields | {"op": Op(fields["op"])})
    except (TypeError, ValueError, KeyError, AttributeError):
        raise invalid from None
    if not 0 < ttl <= (VOLUME_TICKET_S if ticket.op == Op.VOLUME else TICKET_S):
        raise invalid
    now = time.time()
    if issued > now + CLOCK_SKEW_S:
        raise TicketRefused("the ticket was issued in the future (is this host's clock right?)")
    if now > issued + ttl:
        raise TicketExpired("the ticket has expired")
    return ticket, issued + ttl


def signing_key() -> Ed25519PrivateKey:
    """The key relay tickets are signed with: on the control plane only (web servers, the scheduler's worker)."""
    return _private_key(str(settings.RELAY_SIGNING_KEY))


def verify_keys() -> tuple[Ed25519PublicKey, ...]:
    """The keys a relay takes tickets from: every public key in RELAY_VERIFY_KEY (PEM blocks, one after another)."""
    return _public_keys(str(settings.RELAY_VERIFY_KEY))


@functools.cache
def _private_key(path: str) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except FileNotFoundError:
        raise ImproperlyConfigured(
            f"this process signs relay tickets but RELAY_SIGNING_KEY ({path}) is missing: run "
            "`python manage.py make_signing_keys` on the control plane (GPU hosts hold only relay.pub)"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ImproperlyConfigured(f"RELAY_SIGNING_KEY ({path}) is not an Ed25519 private key")
    return key


@functools.cache
def _public_keys(path: str) -> tuple[Ed25519PublicKey, ...]:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ImproperlyConfigured(
            f"the relay checks tickets against RELAY_VERIFY_KEY ({path}), which is missing: copy relay.pub from "
            "the control plane's keys (`python manage.py make_signing_keys` makes it)"
        ) from None
    end = "-----END PUBLIC KEY-----"
    blocks = [block + end for block in text.split(end) if block.strip()]
    keys = tuple(serialization.load_pem_public_key(block.encode()) for block in blocks)
    if not keys or not all(isinstance(key, Ed25519PublicKey) for key in keys):
        raise ImproperlyConfigured(f"RELAY_VERIFY_KEY ({path}) must hold Ed25519 public keys (PEM)")
    return keys


def _verifies(key: Ed25519PublicKey, signature: bytes, signed: bytes) -> bool:
    try:
        key.verify(signature, signed)
    except InvalidSignature:
        return False
    return True


def within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def file_root(path: str) -> str | None:
    """The most specific of FILE_ROOTS that holds the normalized absolute ``path``; None outside them."""
    normal = posixpath.normpath(path)
    for root in sorted(FILE_ROOTS, key=len, reverse=True):
        if within(normal, root):
            return root
    return None
