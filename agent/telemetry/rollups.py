"""Per-minute rollups of a node's samples: kept in memory while the minute runs, written when it ends.

Each card's minute and each workload's minute on each card it holds become
one row (``GpuMinute``, ``WorkloadGpuMinute``): average and peak utilization,
peak memory, average power. A workload's minute on a card stores its
utilization only when every sample of the minute had a reading: a minute with
none, or with gaps (a fraction of a card under MPS has no per-tenant compute
reading: ``nvml.py``), stores NULL, never an average of what happened to be
read, since the unread seconds may be the busy ones. When a minute is written,
each workload's ``gpu_utilization`` (what the scheduler's idle weighting reads)
becomes its average over that minute, or NULL (no reading: the scheduler counts
it fully busy) when any of its cards had none. A flush that fails (database away) keeps the
minutes for the next try, up to ``MAX_PENDING_MINUTES``; older ones are
dropped with a log line. An agent restarted inside a minute writes that
minute again from what it saw since (the row is replaced, not doubled).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime

from scheduler.models import Gpu, GpuMinute, Workload, WorkloadGpuMinute
from scheduler.telemetry.documents import CardReading, TenantReading

log = logging.getLogger(__name__)
MAX_PENDING_MINUTES = 10
FIELDS = list(GpuMinute.VALUES)


@dataclass
class _Folded:
    samples: int = 0
    unread: int = 0  # samples without a utilization reading
    util_sum: float = 0.0
    util_n: int = 0
    util_max: float | None = None
    mem_max: int | None = None
    power_sum: float = 0.0
    power_n: int = 0

    def add(self, util: float | None, mem: int | None, power: float | None) -> None:
        self.samples += 1
        if util is None:
            self.unread += 1
        else:
            self.util_sum += util
            self.util_n += 1
            self.util_max = util if self.util_max is None else max(self.util_max, util)
        if mem is not None:
            self.mem_max = mem if self.mem_max is None else max(self.mem_max, mem)
        if power is not None:
            self.power_sum += power
            self.power_n += 1

    def row(self, *, every_sample_read: bool = False) -> dict:
        """The minute's row; with ``every_sample_read``, utilization only where no sample lacked a reading."""
        read = self.util_n and not (every_sample_read and self.unread)
        return {
            "samples": min(self.samples, 32767),
            "util_avg": self.util_sum / self.util_n if read else None,
            "util_max": self.util_max if read else None,
            "mem_max_mb": self.mem_max,
            "power_avg_w": self.power_sum / self.power_n if self.power_n else None,
        }


class MinuteRollups:
    def __init__(self):
        # minute (epoch seconds) -> key -> folded; key is (uuid, None) for a card, (uuid, workload id) for a share
        self._minutes: dict[int, dict[tuple[str, int | None], _Folded]] = defaultdict(lambda: defaultdict(_Folded))

    def add(self, t: float, cards: list[CardReading], own: dict[tuple[int, str], TenantReading]) -> None:
        minute = self._minutes[int(t // 60) * 60]
        power = {}
        for card in cards:
            minute[(card.uuid, None)].add(card.util, card.mem_used, card.power)
            power[card.uuid] = card.power
        for (workload_id, uuid), reading in own.items():
            minute[(uuid, workload_id)].add(reading.util, reading.mem_used, power.get(uuid))

    def flush(self, now: float) -> int:
        """Write every minute that has ended; returns the rows written."""
        ended = sorted(m for m in self._minutes if m + 60 <= now)
        for dropped in ended[:-MAX_PENDING_MINUTES]:
            log.warning("dropping the GPU rollup of minute %s: the database was unreachable too long", dropped)
            del self._minutes[dropped]
        written = 0
        for minute in ended[-MAX_PENDING_MINUTES:]:
            written += _write(datetime.fromtimestamp(minute, UTC), self._minutes[minute])
            del self._minutes[minute]  # only once written: a failed write raises and keeps it
        return written


def _write(minute: datetime, folded: dict[tuple[str, int | None], _Folded]) -> int:
    gpu_ids = dict(Gpu.objects.filter(uuid__in={uuid for uuid, _ in folded}).values_list("uuid", "pk"))
    cards, shares = [], []
    per_workload: dict[int, list[float | None]] = defaultdict(list)
    live = set(Workload.objects.filter(pk__in={w for _, w in folded if w}).values_list("pk", flat=True))
    for (uuid, workload_id), acc in folded.items():
        if uuid not in gpu_ids:
            continue
        if workload_id is None:
            cards.append(GpuMinute(minute=minute, gpu_id=gpu_ids[uuid], **acc.row()))
        elif workload_id in live:
            row = acc.row(every_sample_read=True)
            shares.append(WorkloadGpuMinute(minute=minute, gpu_id=gpu_ids[uuid], workload_id=workload_id, **row))
            per_workload[workload_id].append(row["util_avg"])
    GpuMinute.objects.bulk_create(cards, update_conflicts=True, unique_fields=["gpu", "minute"], update_fields=FIELDS)
    WorkloadGpuMinute.objects.bulk_create(
        shares, update_conflicts=True, unique_fields=["workload", "gpu", "minute"], update_fields=FIELDS
    )
    for workload_id, values in per_workload.items():
        # No reading on one of its cards: unknown (None), not the others' average, which could read it idle.
        utilization = None if None in values else sum(values) / len(values)
        Workload.objects.filter(pk=workload_id).update(gpu_utilization=utilization)
    return len(cards) + len(shares)
