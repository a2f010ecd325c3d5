"""GPU utilization as the node agent measures it, and what the scheduler keeps of it.

On an NVML host each card is sampled (compute utilization, memory); simulated
cards have no measurement and report nothing, so their work accrues service at
the full rate (the idle weighting needs a real measurement).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Prefetch

from scheduler.models import Allocation, Workload, WorkloadStatus

EMA_WEIGHT = 0.2  # each new sample's weight in the running mean


@dataclass(frozen=True)
class GpuSample:
    uuid: str
    utilization: float  # 0..1
    memory_used_mb: int


def nvml_samples(uuids: list[str]) -> list[GpuSample]:
    """One sample per card, through NVML. Raises pynvml.NVMLError where there is no driver."""
    import pynvml

    pynvml.nvmlInit()
    try:
        samples = []
        for uuid in uuids:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            samples.append(GpuSample(uuid, rates.gpu / 100.0, int(memory.used // (1024 * 1024))))
        return samples
    finally:
        pynvml.nvmlShutdown()


def utilization_record(*, node_name: str, samples: list[GpuSample]) -> int:
    """Fold samples into each running workload's mean utilization on this node; returns how many changed."""
    by_uuid = {s.uuid: s.utilization for s in samples}
    running = Workload.objects.filter(node__name=node_name, status=WorkloadStatus.RUNNING).prefetch_related(
        Prefetch("allocations", Allocation.objects.select_related("gpu"))
    )
    changed = []
    for workload in running:
        values = [by_uuid[a.gpu.uuid] for a in workload.allocations.all() if a.gpu.uuid in by_uuid]
        if not values:
            continue
        now = sum(values) / len(values)
        previous = workload.gpu_utilization
        workload.gpu_utilization = now if previous is None else (1 - EMA_WEIGHT) * previous + EMA_WEIGHT * now
        changed.append(workload)
    Workload.objects.bulk_update(changed, ["gpu_utilization"])
    return len(changed)
