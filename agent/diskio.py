"""Disk I/O of a container: a weight by its share, and optional bandwidth and IOPS caps, through Docker's options.

- **Weight** (``blkio_weight``, 10…1000): 100 per card held (a 0.5-card instance 50, 8 cards 800, work
  without a card 10). It only means something where the kernel has a proportional I/O controller: cgroup
  v1's ``blkio.weight`` / ``blkio.bfq.weight`` (BFQ with group scheduling), cgroup v2's ``io`` controller.
  Where it has none (this development machine: cgroup v1, mq-deadline, no weight file; Docker answers
  "Weight discarded") it is not sent, and the caps below are what holds.
- **Caps** (``device_read_bps`` / ``device_write_bps`` / ``device_read_iops`` / ``device_write_iops``, the
  kernel's blk-throttle, in every cgroup version): ``INSTANCE_IO_READ_MBPS``, ``INSTANCE_IO_WRITE_MBPS``,
  ``INSTANCE_IO_READ_IOPS``, ``INSTANCE_IO_WRITE_IOPS`` per card held (at least one card's worth; 0: no
  cap), on the disks that hold the containers' layers and data volumes (``INSTANCE_IO_DEVICES``, or found
  from Docker's data root and ``VOLUMES_DIR``). Under cgroup v1 the kernel charges only direct and
  synchronous I/O to the container: a buffered write is written back later by the kernel's flusher on no
  container's account, so there the write caps hold for ``O_DIRECT``/``fsync`` writers and the reads,
  not for page-cache writeback (cgroup v2 charges writeback too). ``bench/io_neighbour.py`` measures it.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

MB = 1024 * 1024
CGROUP = Path("/sys/fs/cgroup")


def weight_supported() -> bool:
    """Whether this kernel has a proportional I/O controller that Docker's blkio_weight reaches."""
    v1 = CGROUP / "blkio"
    if v1.is_dir():
        return any((v1 / name).exists() for name in ("blkio.weight", "blkio.bfq.weight"))
    controllers = CGROUP / "cgroup.controllers"
    return controllers.exists() and "io" in controllers.read_text().split()


def weight(cards: float) -> int:
    """100 per card held, within Docker's 10…1000."""
    return min(1000, max(10, round(100 * cards)))


def disk_of(path: str) -> str | None:
    """The whole block device (``/dev/vda``) holding ``path``; None for a filesystem with no device of its own."""
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return None
    block = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if os.major(dev) == 0 or not block.exists():
        return None
    if (block / "partition").exists():
        block = block.resolve().parent
    name = next((line[8:] for line in (block / "uevent").read_text().splitlines() if line.startswith("DEVNAME=")), "")
    return f"/dev/{name}" if name else None


def devices(docker_root: str) -> list[str]:
    """The disks to cap: INSTANCE_IO_DEVICES, else those under Docker's data root and the volumes directory."""
    if settings.INSTANCE_IO_DEVICES:
        return list(settings.INSTANCE_IO_DEVICES)
    found = {disk_of(docker_root), disk_of(settings.VOLUMES_DIR)}
    return sorted(d for d in found if d)


def io_options(cards: float, disks: list[str]) -> dict:
    """Docker's create options for work holding ``cards`` cards' worth (0 for work without a card)."""
    options = {}
    if weight_supported():
        options["blkio_weight"] = weight(cards)
    scale = max(1.0, cards)
    caps = {
        "device_read_bps": settings.INSTANCE_IO_READ_MBPS * MB,
        "device_write_bps": settings.INSTANCE_IO_WRITE_MBPS * MB,
        "device_read_iops": settings.INSTANCE_IO_READ_IOPS,
        "device_write_iops": settings.INSTANCE_IO_WRITE_IOPS,
    }
    for option, per_card in caps.items():
        if per_card and disks:
            options[option] = [{"Path": disk, "Rate": int(per_card * scale)} for disk in disks]
    return options
