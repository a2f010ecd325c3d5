"""GPU readings from NVML (``nvidia-ml-py``), per card and per tenant.

Per card: SM and memory-controller utilization, memory, temperature, power and
its limit, SM and memory clocks, fan, PCIe throughput, volatile uncorrectable
ECC errors and the last XID error; a field the card does not support reads
``null``. Per process: GPU memory (``nvmlDeviceGetComputeRunningProcesses``)
and SM utilization (``nvmlDeviceGetProcessUtilization``), attributed to the
tenant whose container the process runs in (``/proc/<pid>/cgroup``). A tenant
holding 0.3 of a card thus reads its own utilization of its share and its own
memory against its cap, not the whole card's numbers.

NVML is initialised once per backend (``close()`` shuts it down); every call
that fails for one field or one card leaves a gap there, never an exception
out of ``sample``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from scheduler.policy.cluster import WHOLE_CARD
from scheduler.telemetry.cgroups import PROC, container_of_pid
from scheduler.telemetry.documents import Card, CardReading, ContainerUsage, Tenant, TenantReading, tenant_holder

log = logging.getLogger(__name__)
MIB = 1024 * 1024


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
            per_tenant = self._processes(card, handle, by_container)
            for tenant in tenants:
                share = shares.get(tenant.workload_id)
                if share is None:
                    continue
                sm, mem = per_tenant.get(tenant.workload_id, (0.0, 0))
                # The processes' SM time is a fraction of the whole card; the tenant sees it against its share.
                util = None if sm is None else min(sm / (share.milli / WHOLE_CARD), 1.0)
                own[(tenant.workload_id, card.uuid)] = TenantReading(util, mem // MIB)
                reading.tenants.append(tenant_holder(tenant, share, own[(tenant.workload_id, card.uuid)]))
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

    def _processes(self, card: Card, handle, by_container: dict[str, Tenant]) -> dict[int, tuple[float | None, int]]:
        """workload id -> (SM fraction of the whole card, GPU memory bytes) of its processes on this card."""
        n = self._nvml
        pid_tenant = {}
        totals: dict[int, list] = {}
        for proc in self._call(n.nvmlDeviceGetComputeRunningProcesses, handle) or []:
            tenant = by_container.get(container_of_pid(proc.pid, proc=self._proc) or "")
            if tenant is None:
                continue  # a host process or another deployment's container
            pid_tenant[proc.pid] = tenant.workload_id
            entry = totals.setdefault(tenant.workload_id, [0.0, 0])
            entry[1] += proc.usedGpuMemory or 0  # None where the driver hides it
        samples = self._process_utilization(card.uuid, handle)
        if samples is None:
            return {w: (None, mem) for w, (_, mem) in totals.items()}
        latest: dict[int, object] = {}
        for s in samples:  # several samples per process may come back: keep the newest of each
            if s.pid in pid_tenant and (s.pid not in latest or s.timeStamp > latest[s.pid].timeStamp):
                latest[s.pid] = s
        for pid, s in latest.items():
            totals[pid_tenant[pid]][0] += s.smUtil / 100
        return {w: (min(sm, 1.0), mem) for w, (sm, mem) in totals.items()}

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
