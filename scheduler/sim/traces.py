"""Readers for public GPU-cluster traces: Microsoft Philly, Alibaba PAI (openb), and a generic CSV.

Pure Python, no Django: the simulator and the benchmarks use them. A fraction of a card is read as
the trace gives it (openb's exact thousandths); the simulator rounds it up to a size the product
offers (``scheduler.sim.simulator``).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from scheduler.policy.cluster import WHOLE_CARD, CardSpec, NodeSpec


@dataclass
class TraceJob:
    id: int
    submit: float  # seconds from the start of the trace
    duration: float  # seconds of running
    gpu_count: int
    gpu_milli: int = WHOLE_CARD
    user: str = ""
    cpu: int = 0
    memory_mb: int = 0
    gpu_model: str | None = None  # None: any model
    # Spot work and groups (job arrays), as the live Workload and WorkloadGroup carry them.
    spot: bool = False
    group: object = None
    group_cap: int | None = None
    fallback_after: int | None = None  # preemptions after which spot work runs on-demand
    fallback_at: float | None = None  # trace time from which it does
    # Elastic: it may run on elastic_min..elastic_max cards (None: rigid, always gpu_count); elastic_max
    # None is gpu_count. Its duration is its running time on gpu_count cards (the simulator's speedup model).
    elastic_min: int | None = None
    elastic_max: int | None = None
    utilization: float | None = None  # its GPUs' average utilization while it runs (0..1); None: unknown


def detect(path: str | Path) -> str:
    with open(path, newline="") as f:
        header = next(csv.reader(f))
    if "gpu_time" in header and "timestamp" in header:
        return "philly"
    if "gpu_milli" in header and "cpu_milli" in header:
        return "openb"
    if {"submit_time", "duration", "num_gpus"} <= set(header):
        return "generic"
    raise ValueError(f"{path}: unknown trace format (columns {header})")


def read_jobs(path: str | Path, *, min_duration: float = 0, max_gpus: int | None = None) -> list[TraceJob]:
    """Jobs sorted by submit time; Philly's timestamps become seconds from the first submit.

    Every job is kept unless ``max_gpus`` is given (work wider than a node runs as a gang).
    """
    kind = detect(path)
    rows = list(csv.DictReader(open(path, newline="")))
    jobs = []
    if kind == "philly":
        stamps = [datetime.strptime(r["timestamp"], "%Y-%m-%d %H:%M:%S").timestamp() for r in rows]
        start = min(stamps)
        for i, (r, t) in enumerate(zip(rows, stamps, strict=True)):
            jobs.append(TraceJob(i, t - start, float(r["duration"]), int(r["num_gpus"]), user=r["cluster"]))
    elif kind == "openb":
        for i, r in enumerate(rows):
            count = int(r["num_gpu"])
            milli = int(r["gpu_milli"]) if count == 1 else WHOLE_CARD
            submit = float(r["creation_time"])
            end = float(r["deletion_time"] or submit)
            jobs.append(
                TraceJob(
                    i,
                    submit,
                    max(end - submit, 0),
                    count,
                    milli,
                    cpu=int(r["cpu_milli"]),
                    memory_mb=int(r["memory_mib"]),
                )
            )
    else:
        for i, r in enumerate(rows):
            fraction = float(r.get("gpu_fraction") or 1)
            jobs.append(
                TraceJob(
                    i,
                    float(r["submit_time"]),
                    float(r["duration"]),
                    int(r["num_gpus"]),
                    round(fraction * WHOLE_CARD),
                    user=r.get("user", ""),
                    gpu_model=r.get("gpu_model") or None,
                )
            )
    jobs = [j for j in jobs if j.duration >= min_duration and (max_gpus is None or j.gpu_count <= max_gpus)]
    jobs.sort(key=lambda j: (j.submit, j.id))
    return jobs


def read_openb_pods(path: str | Path) -> list[TraceJob]:
    """Every pod of the Alibaba openb pod list, GPU-less ones included (they still take CPU)."""
    return read_jobs(path)


def read_openb_nodes(path: str | Path) -> list[NodeSpec]:
    nodes = []
    for r in csv.DictReader(open(path, newline="")):
        cards = [CardSpec((r["sn"], i), r["model"], 0) for i in range(int(r["gpu"]))]
        nodes.append(NodeSpec(r["sn"], int(r["cpu_milli"]), int(r["memory_mib"]), cards))
    return nodes
