"""What a container sees of its host: its own cores (cpuset) and its own memory and CPUs in /proc (LXCFS).

A CPU quota alone (``nano_cpus``) limits time, not what programs count: ``nproc`` and
``os.sched_getaffinity`` still list every core of the host, and ``free`` / ``/proc/meminfo`` show the
host's memory, so PyTorch's DataLoader (and anything sized from them) starts a worker per host core and
oversubscribes its quota. Both are fixed here, the way AutoDL-style platforms do it:

- **cpuset**: each container is pinned to as many cores as it holds (``cpuset_cpus``), chosen by the
  agent when it creates or starts the container: the cores the fewest running containers of this
  deployment are pinned to, lowest first, under one lock so two launches do not both take the same
  idle cores (the agent keeps who holds which cores in memory, ``PinnedCores``: no list of the engine's
  containers per launch). ``nproc`` then says what was rented, and neighbours stop sharing caches. Where a host
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

from core.errors import InvalidInput

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


LIVE = ["created", "running", "restarting"]  # a container holds its cores in these states


class PinnedCores:
    """The cores each live container of this deployment on this engine is pinned to (created, running or
    restarting), kept in the agent's memory: a launch reads and updates it under its lock rather than list the
    engine's containers (one list, then an inspect of each) every time.

    It is read from the engine at the first launch after the agent starts. The platform's own stops and
    removals drop their container at once; a container that ends by itself (or is removed behind the agent's
    back) goes at the next reconcile, which follows every exit (Docker's events) and replaces its node's
    entries with what Docker showed. A container pinned or dropped after that reconcile read Docker keeps
    its newer entry: each change is numbered, and the reconcile passes the number it read Docker at.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self._cores: dict[str, tuple[str, list[int]]] | None = None  # container id -> (its node, its cores)
        self._changed: dict[str, int] = {}  # container id -> the number of its last change
        self._changes = 0

    def load(self, client, spec: dict, *, excluding: str = "") -> Counter:
        """How many containers are pinned to each core (the caller holds ``lock``). Read from the engine the
        first time, with the deployment's label that the spec carries."""
        if self._cores is None:
            deployment = [f"{k}={v}" for k, v in spec["labels"].items() if k.endswith(".deployment")]
            containers = client.containers.list(
                all=True, filters={"label": deployment, "status": LIVE}, ignore_removed=True
            )
            self._cores = {c.id: (_node(c.labels), cpu_list(cpuset_of(c.attrs))) for c in containers}
        load = Counter()
        for container_id, (_, cores) in self._cores.items():
            if container_id != excluding:
                load.update(cores)
        return load

    def pinned(self, container_id: str, spec: dict, cpus: str) -> None:
        """The container now holds ``cpus`` (the caller holds ``lock``)."""
        self._change(container_id, (_node(spec["labels"]), cpu_list(cpus)))

    def unpinned(self, container_id: str) -> None:
        """The container stopped or is gone: its cores are free."""
        with self.lock:
            self._change(container_id, None)

    def mark(self) -> int:
        """The change number to pass to ``reset`` with what Docker shows from now on."""
        with self.lock:
            return self._changes

    def reset(self, node_name: str, live: dict[str, list[int]], *, since: int) -> None:
        """Node ``node_name``'s live containers are ``live`` (id -> cores), as Docker showed them after ``since``."""
        with self.lock:
            if self._cores is None:
                return  # not read yet: the next launch reads the whole engine
            newer = {i for i, number in self._changed.items() if number > since}
            for container_id, (node, _) in list(self._cores.items()):
                if node == node_name and container_id not in newer:
                    del self._cores[container_id]
            for container_id, cores in live.items():
                if container_id not in newer:
                    self._cores[container_id] = (node_name, cores)
            self._changed = {i: number for i, number in self._changed.items() if i in newer}

    def forget(self) -> None:
        """Read the engine again at the next launch (tests: each starts as an agent does)."""
        with self.lock:
            self._cores, self._changed = None, {}

    def _change(self, container_id: str, entry: tuple[str, list[int]] | None) -> None:
        self._changes += 1
        self._changed[container_id] = self._changes
        if self._cores is None:
            return
        if entry is None:
            self._cores.pop(container_id, None)
        else:
            self._cores[container_id] = entry


pins = PinnedCores()


def _node(labels: dict) -> str:
    return next((v for k, v in (labels or {}).items() if k.endswith(".node")), "")


def cpuset_of(attrs: dict) -> str:
    """The cores a container is pinned to, from its inspect ("" when none)."""
    return (attrs.get("HostConfig") or {}).get("CpusetCpus") or ""


def _cores(spec: dict) -> int:
    return max(1, math.ceil(spec.get("nano_cpus", 0) / 1e9))


def container_create(client, spec: dict, *, host_cpus: int | None = None):
    """``containers.create`` with the container pinned to its cores (INSTANCE_CPUSET); ``host_cpus``: the
    engine's core count where the caller has it (else asked of the engine)."""
    if not settings.INSTANCE_CPUSET:
        return client.containers.create(**spec)
    with pins.lock:
        cpus = cpus_choose(_cores(spec), host_cpus or client.info()["NCPU"], pins.load(client, spec))
        container = client.containers.create(**{**spec, "cpuset_cpus": cpus})
        pins.pinned(container.id, spec, cpus)
        return container


def container_start(client, container, spec: dict, *, host_cpus: int | None = None) -> None:
    """Start a stopped container, pinned again to the cores least used now (its old ones may be taken)."""
    if not settings.INSTANCE_CPUSET:
        container.start()
        return
    with pins.lock:
        load = pins.load(client, spec, excluding=container.id)
        cpus = cpus_choose(_cores(spec), host_cpus or client.info()["NCPU"], load)
        container.update(cpuset_cpus=cpus)
        pins.pinned(container.id, spec, cpus)
        container.start()
