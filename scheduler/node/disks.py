"""Data volumes of a fixed size: an ext4 filesystem in a sparse file, loop-mounted on the host.

With ``INSTANCE_DISK_QUOTA`` on, an instance's or job's data volume holds exactly
``disk_gb``: writing past it fails inside the container with "No space left on
device", and nothing it writes there can fill the host's disk. The file is sparse,
so a volume costs what is written into it. Docker mounts the filesystem into the
container as a bind-backed local volume. The node agent mounts it again when
needed (after a host reboot), and removes it with the volume.

Not limited here: the container's writable layer (overlay2's size limit needs
XFS with project quotas under /var/lib/docker).
"""

import os
import subprocess
from pathlib import Path

from django.conf import settings


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


def disk_delete(volume: str) -> None:
    """Unmount and delete the volume's filesystem (nothing to do if it has none)."""
    image, mount = _paths(volume)
    if os.path.ismount(mount):
        _run("umount", str(mount))
    if mount.is_dir():
        mount.rmdir()
    image.unlink(missing_ok=True)
