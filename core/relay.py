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

A ticket travels as ``Authorization: Bearer <ticket>``; it is signed with
RELAY_SECRET (the same on web servers and agents; SECRET_KEY by default),
valid for TICKET_S seconds by the relay's clock, and good for one request. It
carries every parameter of the operation (the path, the upload's name and
size), so the relay reads nothing the web tier did not sign. Errors come back
as the API shapes them: ``{"detail": ..., "<field>": [...]}`` with 400, 404 or
409; 401 / 403 for a ticket the relay refuses.
"""

from __future__ import annotations

import ipaddress
import posixpath
import secrets
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from urllib.parse import urlsplit

from django.conf import settings
from django.core import signing

SALT = "gpucloud.relay.v1"
TICKET_S = 60
# Where the files pages may go, the default first: the data disk, the user's shared storage, the
# system disk (the rest of /root), as the launcher mounts them. A path belongs to the most specific
# one; a symbolic link that leads out of it is not followed.
HOME = "/root"
FILE_ROOTS = (settings.INSTANCE_DATA_PATH, settings.SHARED_FS_PATH, HOME)
# A node registered without an address is on this machine (tests): its relay answers on loopback.
LOOPBACK = "127.0.0.1"
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
    run: int = 0  # logs: which run's piece, its lines after ``after`` (a seq), the last ``tail``, from ``since``
    after: int = 0
    tail: int = 0
    since: str = ""
    follow: bool = False
    ended: bool = False  # list, download: a job that has ended (its container stopped, kept until it is released)
    nonce: str = field(default_factory=lambda: secrets.token_urlsafe(12))


def relay_base(*, node: str, address: str, relay_url: str) -> str:
    """Where node ``node``'s relay answers, ``scheme://host:port``: its ``relay_url`` if that is http(s) at
    the node's registered ``address`` with a port and nothing after but "/"; ValueError naming the node if not.

    A host's agent writes its own relay URL, and the web tier and the other hosts call whatever it names
    (``http://169.254.169.254/latest/meta-data#`` would swallow the call's path): the URL is checked where it
    is used, and the call's path is always the caller's own.
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
        or not _same_host(parts.hostname or "", registered)
    ):
        raise refused
    host = parts.hostname
    return f"{parts.scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def _same_host(one: str, other: str) -> bool:
    try:
        return ipaddress.ip_address(one) == ipaddress.ip_address(other)
    except ValueError:  # a name (either one): the same name, in any case
        return one.rstrip(".").lower() == other.rstrip(".").lower()


def ticket_sign(ticket: Ticket, *, secret: str) -> str:
    return signing.dumps(asdict(ticket), key=secret, salt=SALT, compress=False)


def ticket_open(token: str, *, secret: str) -> Ticket:
    """The ticket, if ``token`` was signed with ``secret`` less than TICKET_S ago; signing.BadSignature if not."""
    fields = signing.loads(token, key=secret, salt=SALT, max_age=TICKET_S)
    try:
        return Ticket(**fields | {"op": Op(fields["op"])})
    except (TypeError, ValueError, KeyError) as exc:
        raise signing.BadSignature("not a relay ticket") from exc


def within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def file_root(path: str) -> str | None:
    """The most specific of FILE_ROOTS that holds the normalized absolute ``path``; None outside them."""
    normal = posixpath.normpath(path)
    for root in sorted(FILE_ROOTS, key=len, reverse=True):
        if within(normal, root):
            return root
    return None
