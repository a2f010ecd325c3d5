"""Discrete-event replay of a job trace through the scheduling policy (the same ``decide`` as live).

Jobs arrive at their submit time, run for their duration once placed, and
accrue service as they run. A preempted job keeps running through the grace
period (its checkpoint), then returns to the queue and later resumes where it
stopped. Decisions happen at every arrival, completion and eviction, and every
``quantum`` seconds while work waits (so demotions can preempt). ``launch_overhead``
models what a live start costs: a placed job holds its cards that long before its own
time starts (bench/cluster_live.py sets it to what the live cluster measured).

Spot jobs, groups with a running cap and the spot fallback come from the trace jobs' fields
and are honoured by ``decide`` itself; each job's runs (start, end, on spot) are kept so a
benchmark can price them (bench/sweep_cost.py).

Every job is kept: work wider than a node runs as a gang across nodes (``decide`` places it
all or nothing; eviction and completion give back every part). Elastic jobs (a trace job's
``elastic_min``..``elastic_max``) run at whatever size ``decide`` gives them. Speedup model
(``speedup``): a job's duration is its running time at its trace size ``g``; on ``n <= g`` cards
it advances at ``n / g`` of that rate (linear: losing a card costs its whole share, pessimistic
for shrinks, as measured scaling is concave), and each card above ``g`` adds only
``scale_above`` of a card's share (``1 + scale_above * (n - g) / g``): training throughput grows
sublinearly with cards (ElasticFlow, ASPLOS'23, §2: "the training throughput scales non-linearly
with the number of GPUs"; Pollux, OSDI'21, §2: goodput per GPU falls as a job grows), so cards
lent beyond the asked size are worth less than the asked ones. ``scale_above=1`` is linear
throughout. A resize is a restart from checkpoint: the job holds its new
cards for ``restart_s`` seconds before it advances again (the same as the launch overhead).

Fractions as the product offers them: a trace job's fraction of a card is rounded UP to the next
offered size (``share_sizes``, the product's ``SHARE_SIZES`` by default; above the largest, a whole
card), and a card serves one share size at a time (``one_size_per_card``), as live. It runs as long
as the trace says whatever share it gets. ``share_sizes=None`` keeps the trace's exact thousandths and
``one_size_per_card=False`` lets any sizes share a card: the free-form fractions the product had
before the rule, to measure what the rule costs (bench/share_classes.py).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from scheduler.policy.cluster import SHARE_SIZES, WHOLE_CARD, CardSpec, ClusterState, NodeSpec, round_up_share
from scheduler.policy.decide import DISCIPLINES, decide
from scheduler.policy.mlfq import MlfqConfig, Work, accrue
from scheduler.policy.placement import Request, task_mix
from scheduler.policy.predict import DurationHistory
from scheduler.sim.traces import TraceJob


@dataclass
class SimResult:
    policy: str
    jobs: int
    finished: int
    avg_jct: float
    p50_jct: float
    p95_jct: float
    avg_queueing: float
    gpu_allocation_pct: float
    makespan: float
    preemptions: int
    resizes: int = 0
    timeline: list[tuple[float, int, float]] = field(default_factory=list, repr=False)
    # Per job: each run as (placed at, stopped at, on spot), when it finished, how often it was preempted.
    runs: dict[int, list[tuple[float, float, bool]]] = field(default_factory=dict, repr=False)
    done: dict[int, float] = field(default_factory=dict, repr=False)
    preempted: dict[int, int] = field(default_factory=dict, repr=False)
    first_start: dict[int, float] = field(default_factory=dict, repr=False)

    def summary(self) -> dict:
        hidden = {"timeline", "runs", "done", "preempted", "first_start"}
        return {k: (round(v, 1) if isinstance(v, float) else v) for k, v in self.__dict__.items() if k not in hidden}


def _push_completion(completions, now, job_id, duration, executed, speed, version) -> None:
    """(Re)schedule the job's end at its current speed; an earlier entry is void once its version is old."""
    version[job_id] = version.get(job_id, 0) + 1
    end = now + (duration[job_id] - executed[job_id]) / speed[job_id]
    heapq.heappush(completions, (end, version[job_id], job_id))


def speedup(cards: int, asked: int, scale_above: float) -> float:
    """How fast a job on ``cards`` advances relative to its trace size ``asked`` (the module's model)."""
    if cards <= asked:
        return cards / asked
    return 1.0 + scale_above * (cards - asked) / asked


def _may_grow(running, now: float, config: MlfqConfig) -> bool:
    """Whether some elastic running work is below its largest size and may be resized now."""
    return any(
        w.elastic_max is not None
        and w.request.gpu_count < w.elastic_max
        and now - w.resized_at >= config.resize_interval_s
        for w in running
    )


def _give_back(cluster: ClusterState, work: Work) -> None:
    """Every part of the work's capacity (a gang's on each of its nodes)."""
    r = work.request
    for node, cards in work.parts:
        cluster.give(node, cards, r.gpu_milli, r.cpu, r.memory_mb)


def uniform_nodes(gpus: int, per_node: int = 8, model: str = "GPU") -> list[NodeSpec]:
    count = math.ceil(gpus / per_node)
    return [
        NodeSpec(
            f"node-{n}", 10**9, 10**9, [CardSpec((n, c), model, 0) for c in range(min(per_node, gpus - n * per_node))]
        )
        for n in range(count)
    ]


def simulate(
    jobs: list[TraceJob],
    nodes: list[NodeSpec],
    *,
    policy: str = "mlfq",
    config: MlfqConfig | None = None,
    strategy: str = "bestfit",
    quantum: float = 300.0,
    grace: float = 30.0,
    whole_cards_only: bool = False,
    progress: Callable[[int, int], None] | None = None,
    timeline_every: float = 0.0,
    seed: int = 0,
    launch_overhead: float = 0.0,
    restart_s: float = 60.0,
    scale_above: float = 0.5,
    share_sizes: tuple[int, ...] | None = SHARE_SIZES,
    one_size_per_card: bool = True,
) -> SimResult:
    discipline = DISCIPLINES[policy](config)
    config = discipline.config
    cluster = ClusterState(nodes, one_size_per_card=one_size_per_card)
    rng = np.random.default_rng(seed)

    def milli_of(job: TraceJob) -> int:
        """The share of each card the job holds: a trace fraction rounded up to an offered size."""
        if whole_cards_only:
            return WHOLE_CARD
        return job.gpu_milli if share_sizes is None else round_up_share(job.gpu_milli, share_sizes)

    # FGD's expected workload: the trace's own request shapes, as the live tick uses recent submissions.
    shapes = ((j.gpu_count, milli_of(j), j.cpu, j.memory_mb) for j in jobs)
    mix = task_mix(shapes) if strategy == "fgd" else None
    works: dict[int, Work] = {}
    history = DurationHistory()  # finished jobs' running times, as the live tick learns them (config.predict)
    executed: dict[int, float] = {}
    executed_before_launch: dict[int, float] = {}
    first_start: dict[int, float] = {}
    done: dict[int, float] = {}
    duration = {j.id: j.duration for j in jobs}
    base = {j.id: j.gpu_count for j in jobs}
    speed: dict[int, float] = {}  # seconds of trace time per second (``speedup``; 1 if rigid)
    resizes = 0
    utilization = {j.id: j.utilization for j in jobs}
    waiting: dict[int, Work] = {}
    running: dict[int, Work] = {}
    completions: list[tuple[float, int, int]] = []  # (time, version, id)
    evictions: list[tuple[float, int]] = []
    version: dict[int, int] = {}
    preemptions = 0
    runs: dict[int, list[tuple[float, float, bool]]] = {}
    run_start: dict[int, tuple[float, bool]] = {}
    allocated_area = 0.0
    timeline = []
    arrivals = sorted(jobs, key=lambda j: (j.submit, j.id))
    next_arrival = 0
    now = arrivals[0].submit if arrivals else 0.0
    start = now
    last_tick = -math.inf
    stalled = False  # nothing can change until capacity is given back (a blocked FIFO head)
    next_sample = now

    while next_arrival < len(arrivals) or waiting or running:
        candidates = []
        if next_arrival < len(arrivals):
            candidates.append(arrivals[next_arrival].submit)
        if completions:
            candidates.append(completions[0][0])
        if evictions:
            candidates.append(evictions[0][0])
        if running and (waiting or _may_grow(running.values(), now, config)):
            if not stalled:
                candidates.append(last_tick + quantum)
        if not candidates:
            break  # waiting work that can never run (bigger than any node)
        t = max(min(candidates), now)
        share = cluster.allocated_share()
        allocated_area += share * (t - now)
        for work in running.values():
            accrue(work, t - now, utilization[work.id], config)
            executed[work.id] += (t - now) * speed[work.id]
        now = t
        if timeline_every and now >= next_sample:
            timeline.append((now, len(waiting), share))
            next_sample = now + timeline_every

        while completions and completions[0][0] <= now:
            _, v, job_id = heapq.heappop(completions)
            if version.get(job_id) != v or job_id not in running:
                continue
            stalled = False
            work = running.pop(job_id)
            _give_back(cluster, work)
            done[job_id] = now
            history.record(work.user, None, base[job_id], duration[job_id])  # a trace has no images
            runs.setdefault(job_id, []).append((*run_start.pop(job_id), now))
        while evictions and evictions[0][0] <= now:
            _, job_id = heapq.heappop(evictions)
            work = running.pop(job_id, None)
            if work is None:
                continue  # finished during its grace period
            stalled = False
            _give_back(cluster, work)
            runs.setdefault(job_id, []).append((*run_start.pop(job_id), now))
            work.preemptions += 1
            executed[job_id] = max(executed[job_id], executed_before_launch[job_id])  # evicted while launching
            version[job_id] = version.get(job_id, 0) + 1
            work.node, work.cards, work.rest, work.stopping = None, [], [], False
            if work.elastic_max is not None:  # back in the queue it asks its trace size first again
                work.request = replace(work.request, gpu_count=base[job_id])
            work.waiting_since = now
            waiting[job_id] = work
        while next_arrival < len(arrivals) and arrivals[next_arrival].submit <= now:
            job = arrivals[next_arrival]
            next_arrival += 1
            request = Request(job.id, job.gpu_model, job.gpu_count, milli_of(job), job.cpu, job.memory_mb)
            work = Work(
                job.id,
                job.user,
                request,
                submitted=job.submit,
                waiting_since=job.submit,
                preemptible=True,
                spot=job.spot,
                group=job.group,
                group_cap=job.group_cap,
                fallback_after=job.fallback_after,
                fallback_at=job.fallback_at,
                elastic_min=job.elastic_min,
                elastic_max=(job.elastic_max or job.gpu_count) if job.elastic_min is not None else None,
            )
            if config.predict:
                work.predicted = history.predict(job.user, None, job.gpu_count)
            works[job.id] = work
            executed[job.id] = 0.0
            waiting[job.id] = work
            if progress and next_arrival % 5000 == 0:
                progress(next_arrival, len(arrivals))

        if stalled or not waiting and not _may_grow(running.values(), now, config):
            continue
        last_tick = now
        for work in waiting.values():
            work.remaining = duration[work.id] - executed[work.id]
        for work in running.values():
            work.remaining = (duration[work.id] - executed[work.id]) / speed[work.id]
        decisions = decide(
            list(waiting.values()),
            list(running.values()),
            cluster,
            now=now,
            discipline=discipline,
            strategy=strategy,
            mix=mix,
            rng=rng,
        )
        for job_id, level in decisions.levels.items():
            works[job_id].level = level
        for place in decisions.place:
            work = waiting.pop(place.work_id)
            work.node, work.cards, work.started = place.node, place.cards, now
            work.rest = [(p.node, p.cards) for p in place.rest]
            work.resized_at = now
            if work.elastic_min is not None:
                work.request = replace(work.request, gpu_count=place.gpu_count, nodes=None)
            speed[work.id] = speedup(work.request.gpu_count, base[work.id], scale_above)
            running[work.id] = work
            run_start[work.id] = (now, work.spot)
            first_start.setdefault(work.id, now)
            # Its cards are held through the launch before its own time runs (credited back as it passes).
            executed_before_launch[work.id] = executed[work.id]
            executed[work.id] -= launch_overhead * speed[work.id]
            _push_completion(completions, now, work.id, duration, executed, speed, version)
        for resize in decisions.resize:
            resizes += 1
            work = running[resize.work_id]  # decide has moved it to its new parts and size
            speed[work.id] = speedup(resize.gpu_count, base[work.id], scale_above)
            executed[work.id] -= restart_s * speed[work.id]  # the restart from checkpoint holds the new cards
            _push_completion(completions, now, work.id, duration, executed, speed, version)
        # FIFO's blocked head stays blocked until capacity is given back: later arrivals queue behind it.
        stalled = discipline.head_of_line_blocking and bool(decisions.waiting)
        for preempt in decisions.preempt:
            preemptions += 1
            heapq.heappush(evictions, (now + grace, preempt.work_id))

    if progress:
        progress(len(arrivals), len(arrivals))
    jcts = np.array([done[j.id] - j.submit for j in jobs if j.id in done])
    queueing = np.array([first_start[j.id] - j.submit for j in jobs if j.id in first_start])
    makespan = (max(done.values()) - start) if done else 0.0
    return SimResult(
        policy=policy,
        jobs=len(jobs),
        finished=len(done),
        avg_jct=float(jcts.mean()) if jcts.size else 0.0,
        p50_jct=float(np.percentile(jcts, 50)) if jcts.size else 0.0,
        p95_jct=float(np.percentile(jcts, 95)) if jcts.size else 0.0,
        avg_queueing=float(queueing.mean()) if queueing.size else 0.0,
        gpu_allocation_pct=100 * allocated_area / makespan if makespan else 0.0,
        makespan=makespan,
        preemptions=preemptions,
        resizes=resizes,
        timeline=timeline,
        runs={job_id: [(start, end, spot) for (start, spot, end) in r] for job_id, r in runs.items()},
        done=done,
        preempted={j.id: works[j.id].preemptions for j in jobs if j.id in works},
        first_start=first_start,
    )
