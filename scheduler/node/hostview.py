"""What a container sees of its host: its own cores (cpuset) and its own memory and CPUs in /proc (LXCFS).

A CPU quota alone (``nano_cpus``) limits time, not what programs count: ``nproc`` and
``os.sched_getaffinity`` still list every core of the host, and ``free`` / ``/proc/meminfo`` show the
host's memory, so PyTorch's DataLoader (and anything sized from them) starts a worker per host core and
oversubscribes its quota. Both are fixed here, the way AutoDL-style platforms do it:

- **cpuset**: each container is pinned to as many cores as it holds (``cpuset_cpus``), chosen by the
  agent when it creates or starts the container: the cores the fewest running containers of this
  deployment are pinned to, lowest first, under one lock so two launches do not both take the same
  idle cores. ``nproc`` then says what was rented, and neighbours stop sharing caches. Where a host
  advertises more cores than it has (simulated development hosts sharing a machine) cores are shared by
  the fewest containers possible.
- **LXCFS** (Debian's ``lxcfs``, a FUSE filesystem run on the host, ``lxcfs /var/lib/lxcfs``): its
  ``/proc/meminfo``, ``cpuinfo``, ``stat``, ``uptime``… are computed from the reading container's own
  cgroup; they are bound read-only over the container's ``/proc`` files, so ``free`` (procps) and
  ``/proc/cpuinfo`` show the container's limits. ``INSTANCE_LXCFS``: "auto" (when LXCFS is mounted at
  ``LXCFS_DIR``), "on" (a launch fails while it is not), "off". (BusyBox's ``free`` asks the kernel's
  sysinfo(2), which no filesystem can change; procps's reads /proc/meminfo.)
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from pathlib import Path

from django.conf import settings

from scheduler.errors import InvalidInput

LXCFS_FILES = [
    "proc/cpuinfo",
    "proc/diskstats",
    "proc/loadavg",
    "proc/meminfo",
    "proc/stat",
    "proc/swaps",
    "proc/uptime",
    "sys/devices/system/cpu/online",
]
_pinning = threading.Lock()


def lxcfs_volumes() -> dict:
    """Bind mounts of LXCFS's files over the container's own (none when LXCFS is off or, under "auto", absent)."""
    if settings.INSTANCE_LXCFS == "off":
        return {}
    base = Path(settings.LXCFS_DIR)
    if not (base / "proc" / "meminfo").exists():
        if settings.INSTANCE_LXCFS == "on":
            raise InvalidInput(f"LXCFS is not mounted at {base} (INSTANCE_LXCFS=on)", field="lxcfs")
        return {}
    return {str(base / name): {"bind": f"/{name}", "mode": "ro"} for name in LXCFS_FILES if (base / name).exists()}


def cpu_list(text: str) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5] (Docker's and the kernel's cpuset syntax)."""
    cpus = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


def cpus_choose(count: int, host_cpus: int, load: Counter) -> str:
    """The ``count`` cores with the fewest containers pinned to them (``load``), lowest first, as a cpuset."""
    chosen = sorted(sorted(range(host_cpus), key=lambda cpu: (load[cpu], cpu))[:count])
    return ",".join(map(str, chosen))


def _load(client, spec: dict, *, excluding: str = "") -> Counter:
    """How many containers of this deployment (running, or created and about to start) are pinned to each
    core of this engine. The deployment's label is the one the spec carries."""
    deployment = [f"{k}={v}" for k, v in spec["labels"].items() if k.endswith(".deployment")]
    load = Counter()
    containers = client.containers.list(
        all=True, filters={"label": deployment, "status": ["created", "running", "restarting"]}, ignore_removed=True
    )
    for container in containers:
        if container.id != excluding:
            load.update(cpu_list(container.attrs.get("HostConfig", {}).get("CpusetCpus", "")))
    return load


def _cores(spec: dict) -> int:
    return max(1, math.ceil(spec.get("nano_cpus", 0) / 1e9))


def container_create(client, spec: dict, *, host_cpus: int | None = None):
    """``containers.create`` with the container pinned to its cores (INSTANCE_CPUSET); ``host_cpus``: the
    engine's core count where the caller has it (else asked of the engine)."""
    if not settings.INSTANCE_CPUSET:
        return client.containers.create(**spec)
    with _pinning:
        cpus = cpus_choose(_cores(spec), host_cpus or client.info()["NCPU"], _load(client, spec))
        return client.containers.create(**{**spec, "cpuset_cpus": cpus})


def container_start(client, container, spec: dict, *, host_cpus: int | None = None) -> None:
    """Start a stopped container, pinned again to the cores least used now (its old ones may be taken)."""
    if not settings.INSTANCE_CPUSET:
        container.start()
        return
    with _pinning:
        load = _load(client, spec, excluding=container.id)
        container.update(cpuset_cpus=cpus_choose(_cores(spec), host_cpus or client.info()["NCPU"], load))
        container.start()
