"""Data volumes of a fixed size: an ext4 filesystem in a sparse file, loop-mounted on the host.

With ``INSTANCE_DISK_QUOTA`` on, an instance's or job's data volume holds exactly
``disk_gb``: writing past it fails inside the container with "No space left on
device", and nothing it writes there can fill the host's disk. The file is sparse,
so a volume costs what is written into it. Docker mounts the filesystem into the
container as a bind-backed local volume. The node agent mounts it again when
needed (after a host reboot), and removes it with the volume.

The container's writable layer (the system disk, AutoDL's 30 GB) is limited where the engine's storage
driver takes a size per container: ``btrfs`` (a btrfs data root with quotas: config/dev/cluster.sh gives
each development host one, in a loop file) and ``zfs``; the size is INSTANCE_SYSTEM_DISK_GB, and a write
past it fails with "Disk quota exceeded". overlay2 could only with XFS project quotas under the data
root, which this kernel lacks, so on overlay2 the layer stays unlimited.
"""

import os
import subprocess
from pathlib import Path

from django.conf import settings

SIZED_DRIVERS = ("btrfs", "zfs")  # storage drivers whose containers take --storage-opt size=


def system_disk_options(driver: str, image_bytes: int = 0) -> dict:
    """Docker's create options that size the writable layer, for an engine with storage driver ``driver``, of a
    container of an image of ``image_bytes``.

    btrfs's limit is a quota group's limit on what the container's subvolume refers to, and a snapshot of the
    image refers to every byte of the image: there the size is the image's plus INSTANCE_SYSTEM_DISK_GB (in MiB,
    rounded up), so the user gets the same system disk whatever the image, and an image larger than the system
    disk (PyTorch's is 1.15 GB) still starts (a container's saved disk is its image too, so it keeps
    its size on top of what was saved). Other drivers take the size as given."""
    if not settings.INSTANCE_SYSTEM_DISK_GB or driver not in SIZED_DRIVERS:
        return {}
    if driver != "btrfs" or not image_bytes:
        return {"storage_opt": {"size": f"{settings.INSTANCE_SYSTEM_DISK_GB}G"}}
    return {"storage_opt": {"size": f"{settings.INSTANCE_SYSTEM_DISK_GB * 1024 + -(-image_bytes // 2**20)}M"}}


def host_disk_gb(data_root) -> tuple[int, int] | None:
    """(total, free) GB of the filesystem holding the engine's data root (layers, volumes, saved images), where
    ``data_root()`` says; None when it cannot be read (the engine is down: the last report stands)."""
    try:
        stat = os.statvfs(data_root())
    except Exception:  # noqa: BLE001  (an engine that does not answer, a path not visible from here)
        return None
    return stat.f_blocks * stat.f_frsize // 1024**3, stat.f_bavail * stat.f_frsize // 1024**3


def _paths(volume: str) -> tuple[Path, Path]:
    base = Path(settings.VOLUMES_DIR)
    return base / f"{volume}.img", base / volume


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=120)


def disk_ensure(volume: str, size_gb: int) -> dict:
    """Make the volume's filesystem exist and be mounted; returns Docker's local-driver options for it."""
    image, mount = _paths(volume)
    image.parent.mkdir(parents=True, exist_ok=True)
    if not image.exists():
        with open(image, "wb") as f:
            f.truncate(size_gb * 1024**3)
        _run("mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1", str(image))
    mount.mkdir(exist_ok=True)
    if not os.path.ismount(mount):
        _run("mount", "-o", "loop", str(image), str(mount))
    return {"type": "none", "o": "bind", "device": str(mount)}


class DiskBusy(Exception):
    """The disk is in use and this host cannot grow it in place."""


def disk_grow(volume: str, size_gb: int) -> bool:
    """Grow the volume's filesystem to ``size_gb`` (never shrinks); False if it has none.

    Online first (its container may be running): the loop device re-reads the file's new
    size and ext4 grows in place. That needs CAP_SYS_RESOURCE on the host; without it
    (some containerised hosts) the volume is unmounted, checked, grown and mounted again,
    which works while no running container uses it. Either way the filesystem is then looked at: a disk
    that did not grow raises (the size is not recorded, nor charged, as grown).
    """
    image, mount = _paths(volume)
    if not image.exists():
        return False
    if image.stat().st_size >= size_gb * 1024**3:
        return True
    with open(image, "r+b") as f:
        f.truncate(size_gb * 1024**3)
    if os.path.ismount(mount):
        device = subprocess.run(
            ["findmnt", "-n", "-o", "SOURCE", str(mount)], check=True, capture_output=True, text=True
        ).stdout.strip()
        for _ in range(2):  # resize2fs that finds the old size says "Nothing to do!" and succeeds: look, once more
            _run("losetup", "-c", device)
            done = subprocess.run(["resize2fs", device], capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                break
            if _holds(mount, size_gb):
                return True
        else:
            said = (done.stderr or done.stdout).strip().splitlines() or [""]
            raise RuntimeError(f"the disk did not grow to {size_gb} GB in place ({device}: {said[-1][:120]})")
        if subprocess.run(["umount", str(mount)], capture_output=True, timeout=120).returncode != 0:
            raise DiskBusy("this host cannot grow a disk in use: stop the instance, then grow it")
    _run("e2fsck", "-f", "-y", str(image))
    _run("resize2fs", str(image))
    mount.mkdir(exist_ok=True)
    _run("mount", "-o", "loop", str(image), str(mount))
    if not _holds(mount, size_gb):
        raise RuntimeError(f"the disk did not grow to {size_gb} GB")
    return True


def _holds(mount: Path, size_gb: int) -> bool:
    """Whether the filesystem mounted at ``mount`` has (about) ``size_gb``: ext4 keeps a few percent for itself."""
    stat = os.statvfs(mount)
    return stat.f_blocks * stat.f_frsize >= 0.9 * size_gb * 1024**3


def disk_delete(volume: str) -> None:
    """Unmount and delete the volume's filesystem (nothing to do if it has none)."""
    image, mount = _paths(volume)
    if os.path.ismount(mount):
        _run("umount", str(mount))
    if mount.is_dir():
        mount.rmdir()
    image.unlink(missing_ok=True)


def disk_used_bytes(volume: str) -> int | None:
    """Bytes in use on the volume's filesystem; None when it is a plain Docker volume (not measured)."""
    _, mount = _paths(volume)
    if not os.path.ismount(mount):
        return None
    stat = os.statvfs(mount)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize
