"""GPU readings from NVML (``nvidia-ml-py``), per card and per tenant.

Per card: SM and memory-controller utilization, memory, temperature, power and
its limit, SM and memory clocks, fan, PCIe throughput, volatile uncorrectable
ECC errors and the last XID error; a field the card does not support reads
``null``. Per process: GPU memory (``nvmlDeviceGetComputeRunningProcesses``,
and for MPS clients ``nvmlDeviceGetMPSComputeRunningProcesses``) and SM
utilization (``nvmlDeviceGetProcessUtilization``), attributed to the tenant
whose container the process runs in (``/proc/<pid>/cgroup``). A tenant sees
its own numbers, not the whole card's: its utilization of its share (a whole
card's tenant, or any tenant on a card without MPS) and its memory against its
cap.

**A card shared through MPS** (every fraction of a card runs as an MPS client,
``agent.mps``): NVML's per-process SM utilization lists the MPS server's pid
alone, never a client's (measured on an H200, r580: ``../shared/GPU.md``), so a
fractional tenant's own compute is not measurable; it reads ``None`` with the
reason ``SHARED_CARD``, never 0. Its memory is measurable (each client is listed
with its own) and kept; the card's utilization stays. A card counts as shared
when the driver lists an MPS client on it or its MPS server
(``nvidia-cuda-mps-server``, a host process) among its compute processes: both
come from the same calls that attribute memory, where the card's compute mode
(``EXCLUSIVE_PROCESS``) would say only that a daemon *may* serve it. A tenant
with no process at all on a shared card reads 0: nothing of it runs there.

NVML is initialised once per backend (``close()`` shuts it down); every call
that fails for one field or one card leaves a gap there, never an exception
out of ``sample``; a process list the driver does not give leaves its tenants'
readings absent (``NO_READING``), not idle.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from agent.telemetry.cgroups import PROC, container_of_pid
from scheduler.policy.cluster import WHOLE_CARD
from scheduler.telemetry.documents import (
    NO_READING,
    SHARED_CARD,
    Card,
    CardReading,
    ContainerUsage,
    Tenant,
    TenantReading,
    tenant_holder,
)

log = logging.getLogger(__name__)
MIB = 1024 * 1024
MPS_SERVER = "nvidia-cuda-mps-server"


@dataclass
class _Held:
    """One tenant's processes on one card."""

    sm: float | None = 0.0  # SM time, a fraction of the whole card; None: not measurable
    memory: int = 0  # bytes
    absent: str | None = None  # why ``sm`` is None


class NvmlBackend:
    simulated = False

    def __init__(self, cards: list[Card], *, nvml=None, proc: Path = PROC, pcie: bool = True):
        if nvml is None:
            import pynvml as nvml
        self._nvml = nvml
        self._proc = proc
        self._pcie = pcie  # each PCIe reading samples for 20 ms inside the driver
        nvml.nvmlInit()
        self._handles = {c.uuid: nvml.nvmlDeviceGetHandleByUUID(c.uuid) for c in cards}
        self._last_process_sample = {c.uuid: 0 for c in cards}
        self._xid: dict[str, int] = {}
        self._events = self._xid_events()

    def close(self) -> None:
        if self._events is not None:
            self._call(self._nvml.nvmlEventSetFree, self._events)
        self._nvml.nvmlShutdown()

    def sample(
        self, cards: list[Card], tenants: list[Tenant], usage: dict[str, ContainerUsage]
    ) -> tuple[list[CardReading], dict[tuple[int, str], TenantReading]]:
        self._poll_xid()
        by_container = {t.container_id: t for t in tenants if t.container_id}
        readings, own = [], {}
        for card in cards:
            handle = self._handles.get(card.uuid)
            if handle is None:
                continue
            reading = self._card(card, handle)
            shares = {t.workload_id: s for t in tenants for s in t.shares if s.uuid == card.uuid}
            held = self._processes(card, handle, by_container)
            for tenant in tenants:
                share = shares.get(tenant.workload_id)
                if share is None:
                    continue
                own[(tenant.workload_id, card.uuid)] = mine = _own_reading(held, tenant.workload_id, share.milli)
                reading.tenants.append(tenant_holder(tenant, share, mine))
            readings.append(reading)
        return readings, own

    def _card(self, card: Card, handle) -> CardReading:
        n = self._nvml
        rates = self._call(n.nvmlDeviceGetUtilizationRates, handle)
        memory = self._call(n.nvmlDeviceGetMemoryInfo, handle)
        power = self._call(n.nvmlDeviceGetPowerUsage, handle)
        limit = self._call(n.nvmlDeviceGetEnforcedPowerLimit, handle)
        return CardReading(
            index=card.index,
            uuid=card.uuid,
            model=card.model,
            util=None if rates is None else rates.gpu / 100,
            mem_util=None if rates is None else rates.memory / 100,
            mem_used=None if memory is None else int(memory.used // MIB),
            mem_total=None if memory is None else int(memory.total // MIB),
            temp=self._call(n.nvmlDeviceGetTemperature, handle, n.NVML_TEMPERATURE_GPU),
            power=None if power is None else round(power / 1000, 1),
            power_limit=None if limit is None else round(limit / 1000, 1),
            sm_clock=self._call(n.nvmlDeviceGetClockInfo, handle, n.NVML_CLOCK_SM),
            mem_clock=self._call(n.nvmlDeviceGetClockInfo, handle, n.NVML_CLOCK_MEM),
            fan=self._call(n.nvmlDeviceGetFanSpeed, handle),
            pcie_rx=self._pcie_kbs(handle, n.NVML_PCIE_UTIL_RX_BYTES),
            pcie_tx=self._pcie_kbs(handle, n.NVML_PCIE_UTIL_TX_BYTES),
            ecc_dbe=self._call(
                n.nvmlDeviceGetTotalEccErrors, handle, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC
            ),
            xid=self._xid.get(card.uuid),
        )

    def _pcie_kbs(self, handle, counter) -> int | None:
        return self._call(self._nvml.nvmlDeviceGetPcieThroughput, handle, counter) if self._pcie else None

    def _processes(self, card: Card, handle, by_container: dict[str, Tenant]) -> dict[int, _Held] | None:
        """workload id -> its processes on this card; None: the driver listed none of the card's processes."""
        listed = self._card_processes(handle)
        if listed is None:
            return None
        processes, clients = listed
        held: dict[int, _Held] = {}
        pid_tenant = {}
        shared = bool(clients)
        for proc in processes:
            tenant = by_container.get(container_of_pid(proc.pid, proc=self._proc) or "")
            if tenant is None:  # a host process (the MPS server among them) or another deployment's container
                shared = shared or self._is_mps_server(proc.pid)
                continue
            pid_tenant[proc.pid] = tenant.workload_id
            held.setdefault(tenant.workload_id, _Held()).memory += proc.usedGpuMemory or 0  # None: hidden
        if shared:  # the server's SM time is every client's together: none of it is a tenant's own
            for entry in held.values():
                entry.sm, entry.absent = None, SHARED_CARD
            return held
        samples = self._process_utilization(card.uuid, handle)
        if samples is None:
            for entry in held.values():
                entry.sm, entry.absent = None, NO_READING
            return held
        latest: dict[int, object] = {}
        for s in samples:  # several samples per process may come back: keep the newest of each
            if s.pid in pid_tenant and (s.pid not in latest or s.timeStamp > latest[s.pid].timeStamp):
                latest[s.pid] = s
        for pid, s in latest.items():
            held[pid_tenant[pid]].sm += s.smUtil / 100
        return held

    def _card_processes(self, handle) -> tuple[list, set[int]] | None:
        """(the card's compute processes, the pids of its MPS clients); None where the driver gives neither list.

        A client is listed by both calls; the MPS list's entry (its own memory) is the one kept."""
        n = self._nvml
        compute = self._call(n.nvmlDeviceGetComputeRunningProcesses, handle)
        clients = self._call(n.nvmlDeviceGetMPSComputeRunningProcesses, handle)
        if compute is None and clients is None:
            return None
        by_pid = {p.pid: p for p in compute or []}
        by_pid.update({p.pid: p for p in clients or []})
        return list(by_pid.values()), {p.pid for p in clients or []}

    def _is_mps_server(self, pid: int) -> bool:
        name = self._call(self._nvml.nvmlSystemGetProcessName, pid)
        if isinstance(name, bytes):
            name = name.decode(errors="replace")
        return bool(name) and os.path.basename(name) == MPS_SERVER

    def _process_utilization(self, uuid: str, handle):
        n = self._nvml
        try:
            samples = n.nvmlDeviceGetProcessUtilization(handle, self._last_process_sample[uuid])
        except n.NVMLError_NotFound:
            return []  # no process ran a kernel since the last sample: all idle
        except n.NVMLError as exc:
            log.debug("process utilization of %s unavailable: %s", uuid, exc)
            return None
        if samples:
            self._last_process_sample[uuid] = max(s.timeStamp for s in samples)
        return samples

    def _xid_events(self):
        n = self._nvml
        events = self._call(n.nvmlEventSetCreate)
        if events is None:
            return None
        for handle in self._handles.values():
            self._call(n.nvmlDeviceRegisterEvents, handle, n.nvmlEventTypeXidCriticalError, events)
        return events

    def _poll_xid(self) -> None:
        n = self._nvml
        if self._events is None:
            return
        while True:
            try:
                data = n.nvmlEventSetWait_v2(self._events, 0)
            except n.NVMLError:
                return  # NVML_ERROR_TIMEOUT: nothing pending
            uuid = self._call(n.nvmlDeviceGetUUID, data.device)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            if uuid in self._handles:
                self._xid[uuid] = int(data.eventData)
                log.error("XID %s on GPU %s", data.eventData, uuid)

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self._nvml.NVMLError:
            return None


def _own_reading(held: dict[int, _Held] | None, workload_id: int, milli: int) -> TenantReading:
    """A tenant's reading of its share from its processes on the card (``held``: None when unlisted)."""
    if held is None:
        return TenantReading(None, None, NO_READING)
    mine = held.get(workload_id)
    if mine is None:
        return TenantReading(0.0, 0)  # no process of it holds the card: nothing of it runs there
    if mine.sm is None:
        return TenantReading(None, mine.memory // MIB, mine.absent)
    # The processes' SM time is a fraction of the whole card; the tenant sees it against its share.
    return TenantReading(min(mine.sm / (milli / WHOLE_CARD), 1.0), mine.memory // MIB)
