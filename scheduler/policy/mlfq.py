"""Multi-level feedback queue: levels from attained service, and the order within a tick.

- Service is GPU-seconds (cards x seconds, as in Tiresias' 2D-LAS), so wide and
  long work sinks. Work that leaves its GPUs idle (measured utilization below
  ``idle_util``) accrues service at ``idle_weight`` of the rate, so I/O-bound
  and interactive work stays high. Only a reading earns that discount: work
  with none (``None``: a fraction of a card under MPS, whose own compute NVML
  cannot see, or a minute with gaps) counts as fully busy (``service_rate``).
- Work that has waited ``starvation_s`` is promoted back to the top queue.
- Multi-card work (gangs above all) that has waited ``reserve_after_s`` and
  still does not fit gets a reservation (``decide``): the nodes it will take
  accept no other work unless it ends before they free up (Slurm's backfill).
- Elastic work grows at most once per ``resize_interval_s`` (it shrinks whenever outranked work needs it).
- Within a queue: fair share first (a user holding less than an equal share of
  the cluster goes before one holding more, as Slurm's fair-share factor
  does), then first come first served, where a user's priority (high, normal, low)
  reorders only that user's own work (it never jumps another user's).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from scheduler.policy.placement import Request

HIGH, NORMAL, LOW = 0, 1, 2


@dataclass(frozen=True)
class MlfqConfig:
    # GPU-seconds at which work drops to the next queue; len + 1 queues.
    thresholds: tuple[float, ...] = (3600.0, 8 * 3600.0)
    idle_util: float = 0.30
    idle_weight: float = 0.25
    starvation_s: float = 24 * 3600.0
    preemption: bool = True
    fair_share: bool = True
    # Reservation and backfill: multi-card work waiting this long (from its last queueing) that does
    # not fit gets nodes reserved; at most ``reservations`` works hold one at a time, in queue order.
    reserve_after_s: float = 3600.0
    reservations: int = 1
    # Elastic work: the least time between two grows of one work (each is a restart from checkpoint);
    # 600 s, compared with 300 and 1800 s on bench/elastic.py's tune windows.
    resize_interval_s: float = 600.0
    # Inside a queue, work predicted to need the least service left goes first (``expected_remaining``);
    # off: first come first served. Predictions come from the owner's past jobs (``predict.DurationHistory``).
    predict: bool = False

    @property
    def queues(self) -> int:
        return len(self.thresholds) + 1


@dataclass
class Work:
    """A unit of work as the policy sees it (queued or running)."""

    id: object
    user: str
    request: Request
    submitted: float
    waiting_since: float = 0.0
    priority: int = NORMAL
    attained: float = 0.0  # weighted GPU-seconds
    preemptible: bool = False  # batch jobs and spot instances
    spot: bool = False  # spot instances and jobs: any on-demand work may evict them, they evict none of it
    team: str = ""
    # Work of one group (a job array) runs at most ``group_cap`` at a time; the rest waits, queued.
    group: object = None
    group_cap: int | None = None
    # Spot work that may fall back to on-demand (its group allows it): once preempted more than
    # ``fallback_after`` times, or from ``fallback_at`` (the group's deadline) on. None: never.
    preemptions: int = 0
    fallback_after: int | None = None
    fallback_at: float | None = None
    level: int = 0  # the level it had at the previous tick
    # Running work only: where it is, and whether it is already being stopped.
    node: int | None = None
    cards: list[int] = field(default_factory=list)
    # A gang's further members: (node row, card columns) each, rank 1 first; empty for single-node work.
    rest: list[tuple[int, list[int]]] = field(default_factory=list)
    stopping: bool = False
    started: float = 0.0
    remaining: float | None = None  # known only to the oracle (SRTF) baseline
    predicted: float | None = None  # seconds of running its owner's past jobs of its kind predict (None: no guess)
    # Elastic work runs on elastic_min..elastic_max cards (None: rigid). request.gpu_count is its size now
    # (running) or the size it asks first (waiting: placed at that size if it fits, else at elastic_min).
    elastic_min: int | None = None
    elastic_max: int | None = None
    resized_at: float = -float("inf")  # when it last started or changed size

    @property
    def parts(self) -> list[tuple[int, list[int]]]:
        """Every member's (node, cards) while running, rank 0 first."""
        if self.node is None:
            return []
        return [(self.node, self.cards), *self.rest] if self.rest else [(self.node, self.cards)]


def level_of(work: Work, now: float, config: MlfqConfig, *, waiting: bool) -> int:
    if waiting and now - work.waiting_since >= config.starvation_s:
        return 0
    return bisect.bisect_right(config.thresholds, work.attained)


def expected_remaining(work: Work, config: MlfqConfig) -> float:
    """GPU-seconds of service it is expected to need still: its prediction less what it attained, while it has not
    outlived it. With no prediction, or past it, as much again as it attained and at least the first queue's span
    (a heavy tail: the longer work has run, the longer it is likely to run), so it sorts by attained service."""
    if work.predicted is not None:
        left = work.predicted * work.request.gpus - work.attained
        if left > 0:
            return left
    return max(work.attained, config.thresholds[0])


def service_rate(utilization: float | None, *, idle_util: float, idle_weight: float) -> float:
    """How fast service accrues (per card-second held) for work whose GPUs read ``utilization`` (0..1).

    ``None`` is no reading, and no reading is no evidence of idleness: such work accrues at the full rate,
    as if fully busy. A busy fraction of a card shared through MPS reads None (NVML credits its SM time to the
    MPS server), so it can never sink slower than whole-card work doing the same; it earns the idle discount
    only from a reading below ``idle_util`` (on a real card, one with no process there at all)."""
    idle = utilization is not None and utilization < idle_util
    return idle_weight if idle else 1.0


def accrue(work: Work, seconds: float, utilization: float | None, config: MlfqConfig) -> None:
    """Add service for ``seconds`` of running at the measured GPU ``utilization`` (0..1, None: no reading)."""
    rate = service_rate(utilization, idle_util=config.idle_util, idle_weight=config.idle_weight)
    work.attained += work.request.gpus * seconds * rate
