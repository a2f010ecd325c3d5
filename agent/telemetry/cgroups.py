"""A container's CPU and memory use, read the way ``docker stats`` reads it.

The agent runs on the host, so it reads the container's cgroup files directly
(cgroup v1: ``cpuacct.usage`` and ``memory.usage_in_bytes`` less inactive file
cache; cgroup v2: ``cpu.stat`` and ``memory.current`` less ``inactive_file``),
found through ``/proc/<pid>/cgroup`` of the container's main process. Where
those are not visible (an agent inside a container without the host's /proc)
it asks Docker for a one-shot stats reading instead. CPU is a rate: cores
busy between two readings of the same container.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

from scheduler.telemetry.documents import ContainerUsage

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC = Path("/proc")
CONTAINER_ID = re.compile(r"[0-9a-f]{64}")


def container_of_pid(pid: int, *, proc: Path = PROC) -> str | None:
    """The Docker container id a host process runs in, from its cgroup path; None for a host process."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        match = CONTAINER_ID.search(line.rsplit(":", 1)[-1])
        if match:
            return match[0]
    return None


@dataclass
class _Paths:
    cpu: Path  # cpuacct.usage (ns) or cpu.stat (usage_usec)
    memory: Path  # memory.usage_in_bytes or memory.current
    memory_stat: Path
    v2: bool


def _cgroup_paths(pid: int) -> _Paths | None:
    try:
        lines = (PROC / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    by_controller = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            by_controller[controller] = path.lstrip("/")
    if "cpuacct" in by_controller and "memory" in by_controller:
        cpu_dir = next((d for d in ("cpu,cpuacct", "cpuacct,cpu", "cpuacct") if (CGROUP_ROOT / d).is_dir()), "cpuacct")
        memory = CGROUP_ROOT / "memory" / by_controller["memory"]
        return _Paths(
            CGROUP_ROOT / cpu_dir / by_controller["cpuacct"] / "cpuacct.usage",
            memory / "memory.usage_in_bytes",
            memory / "memory.stat",
            v2=False,
        )
    if "" in by_controller:
        base = CGROUP_ROOT / by_controller[""]
        return _Paths(base / "cpu.stat", base / "memory.current", base / "memory.stat", v2=True)
    return None


def _read(paths: _Paths) -> tuple[float, int]:
    """(CPU seconds used in total, memory bytes in use)."""
    stat = dict(line.split() for line in paths.memory_stat.read_text().splitlines() if " " in line)
    if paths.v2:
        cpu_stat = dict(line.split() for line in paths.cpu.read_text().splitlines())
        cpu_s = int(cpu_stat["usage_usec"]) / 1e6
        inactive = int(stat.get("inactive_file", 0))
    else:
        cpu_s = int(paths.cpu.read_text()) / 1e9
        inactive = int(stat.get("total_inactive_file", 0))
    used = int(paths.memory.read_text())
    return cpu_s, max(used - inactive, 0)


class UsageReader:
    """Reads containers' usage; remembers the previous reading of each to turn CPU time into a rate."""

    def __init__(self, docker_client=None):
        self._docker = docker_client
        self._paths: dict[str, _Paths | None] = {}
        self._previous: dict[str, tuple[float, float]] = {}  # container id -> (monotonic time, cpu seconds)

    def read(self, container_ids: list[str]) -> dict[str, ContainerUsage]:
        usage = {}
        for cid in container_ids:
            try:
                cpu_s, memory = self._read_one(cid)
            except Exception as exc:  # a container that just stopped, a racing removal: a gap, not an error
                log.debug("usage of container %s unreadable: %s", cid[:12], exc)
                self._paths.pop(cid, None)
                continue
            now = time.monotonic()
            before = self._previous.get(cid)
            self._previous[cid] = (now, cpu_s)
            rate = None
            if before is not None and now > before[0]:
                rate = max(cpu_s - before[1], 0.0) / (now - before[0])
            usage[cid] = ContainerUsage(cpu=rate, memory_mb=memory // (1024 * 1024))
        for gone in set(self._previous) - set(container_ids):
            self._previous.pop(gone)
            self._paths.pop(gone, None)
        return usage

    def _read_one(self, cid: str) -> tuple[float, int]:
        if cid not in self._paths:
            self._paths[cid] = self._locate(cid)
        paths = self._paths[cid]
        if paths is not None:
            return _read(paths)
        return self._docker_stats(cid)

    def _locate(self, cid: str) -> _Paths | None:
        if self._docker is None:
            return None
        pid = self._docker.api.inspect_container(cid)["State"]["Pid"]
        paths = _cgroup_paths(pid) if pid else None
        if paths is not None and not paths.memory.exists():
            return None  # /proc is the host's but /sys/fs/cgroup is not: ask Docker
        return paths

    def _docker_stats(self, cid: str) -> tuple[float, int]:
        stats = self._docker.api.stats(cid, stream=False, one_shot=True)
        cpu_s = stats["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9
        memory = stats["memory_stats"]
        detail = memory.get("stats", {})
        inactive = detail.get("total_inactive_file", detail.get("inactive_file", 0))
        return cpu_s, max(memory.get("usage", 0) - inactive, 0)
