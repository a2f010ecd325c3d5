"""The shared file storage on this GPU host: the JuiceFS mount, and each user's directory in it.

The node agent mounts the volume at ``SHARED_FS_MOUNT`` when it starts (a FUSE
client of its own, which outlives the agent so running containers keep their
files), and before each launch makes sure the owner's directory exists and
that this host's JuiceFS client already enforces its quota. The launcher binds
that directory at ``SHARED_FS_PATH`` (``/root/autodl-fs``): a container sees
its owner's files only, never the volume's root or another user's directory.

``legacy_migrate`` copies the per-host Docker volumes that held shared storage
before (``/root/shared``) into the user's directory (``manage.py sharedfs_migrate``).

What lies below a user's directory is the tenant's: he may have put a symbolic link
where a folder of the agent's belongs (``checkpoints -> /etc``). The agent, root on
the host, never follows one there: it walks down from the mount point a folder at a
time, each opened with O_NOFOLLOW relative to the one above (``_dir_open``), makes
what is missing there, and deletes with ``rmtree`` relative to a folder so opened.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import threading
import time
import uuid
from pathlib import Path

from django.conf import settings

from scheduler import sharedfs
from scheduler.sharedfs import SharedFsError

log = logging.getLogger(__name__)
FUSE_DEVICE = "/dev/fuse"
MOUNT_WAIT_S = 60  # how long `juicefs mount --background` waits for the mount point (under the 120 s we wait for it)
LEGACY_PREFIX = "gpucloud-{deployment}-shared-"


def user_dir_on_host(owner_id: int) -> str:
    """Where the user's directory is on this host (the source of the container's bind mount)."""
    return os.path.join(settings.SHARED_FS_MOUNT, sharedfs.USERS_DIR, str(int(owner_id)))


def checkpoint_dir_on_host(owner_id: int, uid: str) -> str:
    """Where a job's checkpoint folder (its AUTO_TMPDIR) is on this host's mount."""
    return os.path.join(user_dir_on_host(owner_id), sharedfs.checkpoint_dir(uid))


def checkpoint_dir_ensure(owner_id: int, uid: str) -> str:
    """The job's checkpoint folder, made if missing (before its container starts: the bind's source must exist);
    SharedFsError if a symbolic link (or a file) stands where a folder of its path belongs."""
    os.close(_dir_open(_checkpoint_parts(owner_id, uid), create=True))
    return checkpoint_dir_on_host(owner_id, uid)


def checkpoint_dir_remove(owner_id: int, uid: str) -> bool:
    """Delete a job's checkpoint folder (the job is released); True if there was one. Any host may do it: every
    host mounts the same volume. A link in its place is removed itself, never what it points to; a link above
    it means the folder is not there."""
    *above, name = _checkpoint_parts(owner_id, uid)
    try:
        parent = _dir_open(above, create=False)
    except SharedFsError as exc:
        log.warning("checkpoints of %s (user %s) not removed: %s", uid, owner_id, exc.message)
        return False
    if parent is None:
        return False
    try:
        try:
            found = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(found.st_mode):
            shutil.rmtree(name, dir_fd=parent, ignore_errors=True)
        else:
            os.unlink(name, dir_fd=parent)
        return True
    finally:
        os.close(parent)


def _checkpoint_parts(owner_id: int, uid: str) -> list[str]:
    return [sharedfs.USERS_DIR, str(int(owner_id)), *sharedfs.checkpoint_dir(uid).split("/")]


def _dir_open(parts: list[str], *, create: bool) -> int | None:
    """A descriptor of the folder SHARED_FS_MOUNT/<parts>, each part opened below the last without following a
    symbolic link, and made first if missing (``create``); None if one is missing (not ``create``).
    SharedFsError if one is a symbolic link or not a folder."""
    fd = os.open(settings.SHARED_FS_MOUNT, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for depth, part in enumerate(parts):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            try:
                below = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if create:
                    raise
                os.close(fd)
                return None
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                where = os.path.join(settings.SHARED_FS_MOUNT, *parts[: depth + 1])
                raise SharedFsError(f"shared storage: {where} is a symbolic link or a file, not a folder") from None
            os.close(fd)
            fd = below
        return fd
    except BaseException:
        os.close(fd)
        raise


def resolved(mount_point: str) -> str:
    """The mount point's real path, found without touching the mount itself (whose client may not answer)."""
    mount_point = mount_point.rstrip("/") or "/"
    return os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(mount_point))), os.path.basename(mount_point))


def mounted_volume(mount_point: str) -> str | None:
    """The JuiceFS volume mounted at ``mount_point`` (from /proc/self/mountinfo), or None."""
    wanted = resolved(mount_point)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            separator = fields.index("-")
            point = fields[4].encode().decode("unicode_escape")  # octal escapes: \040 is a space
            fstype, source = fields[separator + 1], fields[separator + 2]
            if point == wanted and fstype == "fuse.juicefs":
                return source.removeprefix("JuiceFS:")
    return None


def mount_ensure() -> str:
    """Mount the volume at SHARED_FS_MOUNT unless it is; returns the mount point.

    A mount whose client died (ENOTCONN) is detached and mounted again. Raises
    SharedFsError saying why when this host cannot mount it (no FUSE, the
    metadata service unreachable, another volume mounted there).
    """
    point = settings.SHARED_FS_MOUNT
    name = mounted_volume(point)
    if name is not None:
        if name != settings.SHARED_FS_NAME:
            raise SharedFsError(
                f"shared storage: {point} holds the JuiceFS volume {name!r}, not {settings.SHARED_FS_NAME!r}"
            )
        try:
            os.statvfs(point)
            client_remember(point)
            return point
        except OSError as exc:  # its juicefs process is gone: "Transport endpoint is not connected"
            log.warning("shared storage at %s is dead (%s): mounting it again", point, exc)
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=60)
    if not os.path.exists(FUSE_DEVICE):
        raise SharedFsError(
            f"shared storage: this host has no FUSE ({FUSE_DEVICE} is missing): load the fuse module "
            "(modprobe fuse), or start the agent's container with --device /dev/fuse --cap-add SYS_ADMIN"
        )
    Path(point).mkdir(parents=True, exist_ok=True)
    log_file = f"{point.rstrip('/')}.log"
    sharedfs.juicefs(
        "mount",
        "--background",
        "--no-usage-report",
        "--log",
        log_file,
        "--cache-dir",
        settings.SHARED_FS_CACHE_DIR,
        "--cache-size",
        str(settings.SHARED_FS_CACHE_MB),
        "--metrics",
        "127.0.0.1:0",
        *settings.SHARED_FS_MOUNT_OPTIONS,
        settings.SHARED_FS_META,
        point,
        timeout=120,
        # `--background` waits for the mount point 10 s by default, which a loaded host (the several-host setup on
        # 2 cores, three agents starting at once) can miss; JuiceFS (>= 1.2) reads this variable for that wait.
        env={"JFS_MOUNT_TIMEOUT": str(MOUNT_WAIT_S)},
    )
    if mounted_volume(point) != settings.SHARED_FS_NAME:
        raise SharedFsError(f"shared storage: juicefs mount did not mount {point}: see {log_file}")
    client_remember(point)
    log.info("shared storage: JuiceFS volume %s mounted at %s", settings.SHARED_FS_NAME, point)
    return point


def client_pids(point: str) -> list[int]:
    """The JuiceFS client mounted at ``point``: its supervisor's and its own pid (from its ``.config``)."""
    try:
        config = json.loads(Path(point, ".config").read_text())
    except (OSError, ValueError):  # not mounted, or its internal files hidden
        return []
    return [pid for pid in (config.get("PPid"), config.get("Pid")) if pid]


def client_drop_if_stuck(point: str, *, wait_s: float) -> list[int]:
    """Kill this host's JuiceFS client if its mount does not answer a metadata lookup within ``wait_s``; returns
    the pids killed (none: it answered, or nothing is mounted).

    The self-fence's (``agent.selffence``) second half: a host cut off from the control plane is mostly cut off
    from the shared storage's metadata service too, and then a job's write to its checkpoint folder hangs in
    the kernel — a FUSE request waits on the client, which retries the metadata service without end — where
    SIGKILL cannot end the job, and the write would land once the network returns: after the job was requeued
    on another host and resumed from that folder. Killing the client fails every request it holds (the job
    dies at once) and drops what it had not committed. The mount stays dead until the next launch here mounts
    it again (``mount_ensure``); an instance left running here reads "Transport endpoint is not connected"
    in /root/autodl-fs until it is restarted — its files could not be reached meanwhile anyway.
    """
    if mounted_volume(point) is None:
        return []
    probe = threading.Thread(target=_lookup, args=(os.path.join(point, f".fence-probe-{uuid.uuid4().hex}"),))
    probe.daemon = True  # stuck in the kernel until the client answers or dies
    probe.start()
    probe.join(wait_s)
    if not probe.is_alive():
        return []
    pids = client_processes(point)
    for pid in pids:  # the supervisor first: it would start the client again
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    log.error("shared storage at %s did not answer within %.0f s: its JuiceFS client %s killed", point, wait_s, pids)
    return pids


def _lookup(path: str) -> None:
    try:
        os.lstat(path)  # a name never cached: the client asks the metadata service
    except OSError:
        pass


def client_processes(point: str) -> list[int]:
    """The JuiceFS processes serving ``point`` (its supervisor, then its client), as written down when the mount
    last answered (``client_remember``), still running: read without asking the mount, which may hang. (Their
    command lines cannot tell: JuiceFS rewrites its own, cut short.)"""
    try:
        pids = [int(word) for word in Path(_pids_file(point)).read_text().split()]
    except (OSError, ValueError):
        return []
    return [pid for pid in pids if _is_juicefs(pid)]


def client_remember(point: str) -> None:
    """Write down the client of a mount that answers (beside its log), for ``client_processes``."""
    pids = client_pids(point)
    if pids:
        Path(_pids_file(point)).write_text(" ".join(map(str, pids)))


def _pids_file(point: str) -> str:
    return f"{point.rstrip('/')}.pids"


def _is_juicefs(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "juicefs" and _alive(pid)
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def unmount(point: str, *, wait_s: float = 30) -> list[int]:
    """Unmount a JuiceFS mount point and wait for its client to end; returns its pids still alive after ``wait_s``.

    The client closes its session in the metadata service as it ends: keep that
    service up until then.
    """
    if mounted_volume(point) is None:
        return []
    pids = client_pids(point)
    sharedfs.juicefs("umount", "--flush", point, timeout=120)
    deadline = time.monotonic() + wait_s
    while (left := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def quota_seen(point: str, path: str) -> bool:
    """Whether this host's JuiceFS client enforces a quota on ``path``.

    JuiceFS answers statfs on a directory under a quota with the quota as its
    size, smaller than the whole volume's; a client learns a new quota at its
    next heartbeat.
    """
    try:
        mine = os.statvfs(path)
    except FileNotFoundError:
        return False
    volume = os.statvfs(point)
    return mine.f_blocks * mine.f_frsize < volume.f_blocks * volume.f_frsize


def user_dir_ready(owner_id: int) -> str:
    """Mount if needed, give the user its directory and quota, wait until this host enforces it; its host path.

    The wait (only for a user new to this host's client, at most one JuiceFS
    heartbeat) means nothing a container writes escapes the quota's count.
    """
    point = mount_ensure()
    path = user_dir_on_host(owner_id)
    if quota_seen(point, path):
        return path
    sharedfs.user_ensure(owner_id)
    deadline = time.monotonic() + settings.SHARED_FS_QUOTA_WAIT_S
    while not quota_seen(point, path):
        if time.monotonic() > deadline:
            raise SharedFsError(
                f"shared storage: the quota of user {owner_id} did not reach this host's JuiceFS client "
                f"within {settings.SHARED_FS_QUOTA_WAIT_S} s (see {point.rstrip('/')}.log)"
            )
        time.sleep(0.2)
    return path


def legacy_volumes(client) -> dict[int, object]:
    """This deployment's Docker volumes that held shared storage before JuiceFS, by owner id."""
    prefix = LEGACY_PREFIX.format(deployment=settings.DEPLOYMENT_ID)
    found = {}
    for volume in client.volumes.list(filters={"label": f"gpucloud.deployment={settings.DEPLOYMENT_ID}"}):
        owner = volume.name.removeprefix(prefix)
        if volume.name.startswith(prefix) and owner.isdigit():
            found[int(owner)] = volume
    return found


def tree_size(root: str) -> tuple[int, int]:
    """(files, bytes) under ``root``, not following symbolic links."""
    files = size = 0
    for directory, _, names in os.walk(root):
        for name in names:
            st = os.lstat(os.path.join(directory, name))
            files += 1
            size += st.st_size
    return files, size


def legacy_migrate(owner_id: int, volume, *, host: str, remove: bool) -> tuple[str, int, int]:
    """Copy a legacy shared volume into ``users/<id>/shared-from-<host>``; returns (where, files, bytes).

    The copy is checked (same number of files and bytes) before the volume is
    removed (only with ``remove``). Running it again after a checked copy only
    removes the volume; a copy that would pass the quota fails (EDQUOT) and
    leaves the volume as it was.
    """
    source = volume.attrs["Mountpoint"]
    target = os.path.join(user_dir_ready(owner_id), f"shared-from-{host}")
    wanted = tree_size(source)
    if not os.path.exists(target):
        done = subprocess.run(["cp", "-a", f"{source}/.", target], capture_output=True, text=True, timeout=86400)
        if done.returncode != 0:
            shutil.rmtree(target, ignore_errors=True)
            raise SharedFsError(f"copying {volume.name} failed: {done.stderr.strip()[-300:]}")
    copied = tree_size(target)
    if copied != wanted:
        raise SharedFsError(f"{target} differs from {volume.name}: {copied} vs {wanted} (files, bytes); volume kept")
    if remove:
        volume.remove()
    return target, *copied
