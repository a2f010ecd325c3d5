"""Per-job GPU utilization for trace replay: a distribution, and the seeded generator that attaches it.

No shared arrival trace (Philly, PAI 2023 openb) carries utilization, so the simulator's jobs
get one drawn from a distribution: each job's lifetime-average utilization of the cards it
holds (0..1), constant while it runs, drawn independently of its size and duration (nothing
published ties them together for these traces, so the generator assumes nothing).

Two sources:

- ``PAI_2020``, the default: the lifetime-average GPU utilization of the 3,033,232 instances
  in the ``pai_sensor_table`` (``gpu_wrk_util``) of Alibaba's PAI GPU trace v2020 (Weng et
  al., "MLaaS in the Wild", USENIX NSDI'22; github.com/alibaba/clusterdata,
  ``cluster-trace-gpu-v2020``). The table itself (1 GB, hosted outside GitHub) is not
  reachable from here; its quantiles are the ones published by affinode's analysis of it
  (affinode.io/case-studies/alibaba-gpu-v2020): 34.5 % of instances at exactly 0, median
  1.5 %, 75.4 % below 10 %, 95 % below 50 %, mean 10.5 %. Between those points the CDF is
  taken as linear; its mean is then 11.2 %, close to the published 10.5 %, which says the
  interpolation does not invent much.
- ``measured(values)``: an empirical distribution of per-workload averages, e.g. the
  platform's own minute rollups (``scheduler.telemetry.profiles.workload_utilizations``).
  On a host with GPUs those come from NVML; on a host without (``simgpu``) a workload's
  "GPU" utilization is its container's CPU activity (one busy core reads 100 %), so they
  measure how busy the containers were, not a GPU.

Seeded per job (``seed`` and the job's id), so a job keeps its utilization whichever window
or subset of the trace it is replayed in.
"""

from __future__ import annotations

import bisect
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

from scheduler.sim.traces import TraceJob


@dataclass(frozen=True)
class Distribution:
    """A CDF through ``points`` (utilization, P(U <= utilization)), linear between them.

    The first point's probability is a mass at its utilization (e.g. 34.5 % of jobs at 0).
    """

    name: str
    points: tuple[tuple[float, float], ...]
    source: str = ""

    def __post_init__(self):
        us = [u for u, _ in self.points]
        ps = [p for _, p in self.points]
        if not self.points or us != sorted(us) or ps != sorted(ps) or us[0] < 0 or us[-1] > 1 or ps[-1] != 1:
            raise ValueError(f"{self.name}: points must rise from utilization >= 0 to (<= 1, probability 1)")

    def quantile(self, q: float) -> float:
        """The utilization below which a share ``q`` (0..1) of jobs lie."""
        ps = [p for _, p in self.points]
        i = bisect.bisect_left(ps, q)
        if i == 0:
            return self.points[0][0]
        (u0, p0), (u1, p1) = self.points[i - 1], self.points[i]
        return u1 if p1 == p0 else u0 + (u1 - u0) * (q - p0) / (p1 - p0)

    def share_below(self, utilization: float) -> float:
        """P(U < utilization), as the CDF's line says."""
        us = [u for u, _ in self.points]
        i = bisect.bisect_left(us, utilization)
        if i == 0:
            return 0.0
        if i == len(us):
            return 1.0
        (u0, p0), (u1, p1) = self.points[i - 1], self.points[i]
        return p0 + (p1 - p0) * (utilization - u0) / (u1 - u0)

    def mean(self) -> float:
        u, p = self.points[0]
        total = u * p
        for (u0, p0), (u1, p1) in zip(self.points, self.points[1:], strict=False):
            total += (p1 - p0) * (u0 + u1) / 2
        return total


PAI_2020 = Distribution(
    "pai2020",
    ((0.0, 0.345), (0.015, 0.50), (0.10, 0.754), (0.50, 0.95), (1.0, 1.0)),
    "Alibaba PAI GPU trace v2020, pai_sensor_table gpu_wrk_util (Weng et al., NSDI'22); "
    "quantiles as published by affinode.io/case-studies/alibaba-gpu-v2020",
)


def measured(values: Iterable[float], *, name: str = "measured", source: str = "") -> Distribution:
    """The empirical distribution of measured per-job utilizations (each clipped to 0..1): a step CDF,
    so a draw is always one of the measured values, each as often as it was measured."""
    data = sorted(min(max(float(v), 0.0), 1.0) for v in values)
    if not data:
        raise ValueError(f"{name}: no measured utilization to build a distribution from")
    counts = Counter(data)
    points: list[tuple[float, float]] = []
    below = 0
    for u in sorted(counts):
        if points:
            points.append((u, below / len(data)))
        below += counts[u]
        points.append((u, below / len(data)))
    return Distribution(name, tuple(points), source)


def utilization_of(job_id: int, distribution: Distribution, seed: int = 0) -> float:
    q = random.Random(f"{distribution.name}:{seed}:{job_id}").random()
    return round(distribution.quantile(q), 4)


def attach(jobs: Iterable[TraceJob], distribution: Distribution = PAI_2020, *, seed: int = 0) -> list[TraceJob]:
    """Copies of ``jobs``, each with a ``utilization`` drawn from ``distribution``."""
    return [replace(job, utilization=utilization_of(job.id, distribution, seed)) for job in jobs]
