"""One scheduling decision: which queued work to place where, and which running work to evict.

``decide`` takes plain objects and returns plain decisions with reasons a
person can read; the live tick and the trace simulator call it alike. The
order of queued work and who may evict whom come from a ``Discipline``:
MLFQ (the product), and the FIFO, SRTF and LAS baselines.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from scheduler.policy.cluster import WHOLE_CARD, ClusterState
from scheduler.policy.mlfq import MlfqConfig, Work, level_of
from scheduler.policy.placement import TaskType, choose
from scheduler.policy.shortage import host_shortage


@dataclass
class Place:
    work_id: object
    node: int  # row in the ClusterState
    cards: list[int]
    memory_mb: list[int]


@dataclass
class Preempt:
    work_id: object
    for_work_id: object
    reason: str


@dataclass
class Wait:
    level: int
    position: int
    reason: str


@dataclass
class Decisions:
    place: list[Place] = field(default_factory=list)
    preempt: list[Preempt] = field(default_factory=list)
    waiting: dict[object, Wait] = field(default_factory=dict)
    levels: dict[object, int] = field(default_factory=dict)
    promoted: list[object] = field(default_factory=list)
    demoted: list[object] = field(default_factory=list)
    # Waiting spot work that runs on-demand from now on (preempted too often, or past its deadline).
    on_demand: list[object] = field(default_factory=list)


@dataclass
class Quotas:
    """Most cards a user (or team) may hold at once; missing means no limit."""

    per_user: dict[str, float] = field(default_factory=dict)
    per_team: dict[str, float] = field(default_factory=dict)
    default_user: float | None = None


class Discipline:
    """MLFQ: the product's discipline. Subclasses are the baselines."""

    name = "mlfq"
    head_of_line_blocking = False

    def __init__(self, config: MlfqConfig | None = None):
        self.config = config or MlfqConfig()

    def level(self, work: Work, now: float, *, waiting: bool) -> int:
        return level_of(work, now, self.config, waiting=waiting)

    def key(self, work: Work, level: int, over_share: bool, arrival: float):
        """``arrival``: the work's place in line once its owner's priorities reorder their own work."""
        return (level, over_share, arrival, str(work.id))

    def may_preempt(self, waiter: Work, waiter_level: int, victim: Work, victim_level: int) -> bool:
        if not self.config.preemption or not victim.preemptible or victim.stopping:
            return False
        if victim.spot and not waiter.spot:
            return True  # on-demand work (instances and jobs) evicts spot capacity whatever the queues say
        if waiter.spot and not victim.spot:
            return False  # spot capacity is what is left over: it never evicts on-demand work
        return victim_level > waiter_level


class Fifo(Discipline):
    """First come first served, no preemption, the head of the queue blocks (YARN-CS style)."""

    name = "fifo"
    head_of_line_blocking = True

    def level(self, work, now, *, waiting):
        return 0

    def key(self, work, level, over_share, arrival):
        return (work.submitted, str(work.id))

    def may_preempt(self, waiter, waiter_level, victim, victim_level):
        return False


class Srtf(Discipline):
    """Shortest remaining time first, preemptive: the oracle bound (it knows durations)."""

    name = "srtf"

    def level(self, work, now, *, waiting):
        return 0

    def key(self, work, level, over_share, arrival):
        return (work.remaining * work.request.gpus, work.submitted, str(work.id))

    def may_preempt(self, waiter, waiter_level, victim, victim_level):
        return (
            victim.preemptible
            and not victim.stopping
            and (victim.remaining * victim.request.gpus > 2 * waiter.remaining * waiter.request.gpus)
        )


class Las(Discipline):
    """Plain 2D-LAS (Tiresias): MLFQ on GPU-seconds without idle weighting or fair share."""

    name = "las"

    def __init__(self, config: MlfqConfig | None = None):
        base = config or MlfqConfig()
        super().__init__(MlfqConfig(base.thresholds, base.idle_util, 1.0, base.starvation_s, base.preemption, False))


DISCIPLINES = {d.name: d for d in (Discipline, Fifo, Srtf, Las)}


def _no_room(work: Work) -> str:
    r = work.request
    model = r.gpu_model or "GPU"
    if r.gpu_milli < WHOLE_CARD:
        return f"no {model} card has {r.gpu_milli / WHOLE_CARD:g} free"
    if r.gpu_count == 1:
        return f"no free {model} card"
    return f"no node has {r.gpu_count} free {model} cards"


def decide(
    waiting: list[Work],
    running: list[Work],
    cluster: ClusterState,
    *,
    now: float,
    discipline: Discipline | None = None,
    strategy: str = "fgd",
    mix: list[TaskType] | None = None,
    quotas: Quotas | None = None,
    rng: np.random.Generator | None = None,
) -> Decisions:
    """Decide one tick. ``cluster`` is the free capacity and is updated for the placements made."""
    discipline = discipline or Discipline()
    out = Decisions()
    for work in waiting:
        if work.spot and falls_back(work, now):
            work.spot = False
            out.on_demand.append(work.id)
    run_levels = {}
    for work in running:
        run_levels[work.id] = discipline.level(work, now, waiting=False)
    wait_levels = {w.id: discipline.level(w, now, waiting=True) for w in waiting}
    for work in [*running, *waiting]:
        level = run_levels.get(work.id, wait_levels.get(work.id))
        out.levels[work.id] = level
        if level > work.level:
            out.demoted.append(work.id)
        elif level < work.level:
            out.promoted.append(work.id)

    held: dict[str, float] = defaultdict(float)
    team_held: dict[str, float] = defaultdict(float)
    # Members of a group running now, stopping ones too: their containers still run until they stop.
    group_running: dict[object, int] = defaultdict(int)
    for work in running:
        if work.group is not None:
            group_running[work.group] += 1
        if not work.stopping:
            held[work.user] += work.request.gpus
            team_held[work.team] += work.request.gpus
    # Fair share, as Slurm's: an equal share of the cluster per active user, and per active team for work
    # that has one; a user or team at or over its share goes after those under it.
    active = [*running, *waiting]
    fair = cluster.total_cards / max(len({w.user for w in active}), 1)
    team_fair = cluster.total_cards / max(len({w.team for w in active if w.team}), 1)
    fair_share = getattr(discipline.config, "fair_share", False)

    # Projected holdings: a user's (and team's) earlier queued work counts against their later work.
    projected, team_projected = defaultdict(float, held), defaultdict(float, team_held)
    keyed = []
    arrival = _arrivals_by_own_priority(waiting, wait_levels)
    for work in sorted(waiting, key=lambda w: (wait_levels[w.id], arrival[w.id], str(w.id))):
        over = fair_share and (
            projected[work.user] >= fair or bool(work.team) and team_projected[work.team] >= team_fair
        )
        projected[work.user] += work.request.gpus
        team_projected[work.team] += work.request.gpus
        # Spot work takes what on-demand work leaves: it goes after all of it, whatever its queue (else a
        # spot job that was just evicted for on-demand work would take the freed cards straight back).
        keyed.append(((work.spot, *discipline.key(work, wait_levels[work.id], over, arrival[work.id])), work))
    keyed.sort(key=lambda pair: pair[0])

    positions: dict[int, int] = defaultdict(int)
    blocked: dict[tuple, str] = {}
    freeing = [w for w in running if w.stopping]
    victims_by_node: dict[int, list[Work]] = defaultdict(list)
    for work in running:
        if not work.stopping and work.node is not None:
            victims_by_node[work.node].append(work)
    head_blocked = False
    no_victims: set[tuple] = set()  # (shape, level, preemptible) that found no one to evict this tick
    fits_after: dict[tuple, bool] = {}  # shape -> fits once the work being evicted has left

    def wait(work: Work, level: int, why: str) -> None:
        positions[level] += 1
        where = f"position {positions[level]} in queue {level}"
        out.waiting[work.id] = Wait(level, positions[level], f"waiting: {why}; {where}")

    for _, work in keyed:
        level = wait_levels[work.id]
        if head_blocked:
            wait(work, level, "behind earlier work")
            continue
        if work.group is not None and work.group_cap is not None and group_running[work.group] >= work.group_cap:
            wait(work, level, f"at most {work.group_cap} of its array run at once")
            continue
        quota_reason = _over_quota(work, held, team_held, quotas)
        if quota_reason:
            wait(work, level, quota_reason)
            continue
        r = work.request
        shape = (r.gpu_model, r.gpu_count, r.gpu_milli, r.cpu, r.memory_mb, r.pinned_node)
        choice = None if shape in blocked else choose(cluster, r, strategy, mix=mix, rng=rng)
        if choice is not None:
            memory = cluster.take(choice.node, choice.cards, r.gpu_milli, r.cpu, r.memory_mb)
            out.place.append(Place(work.id, choice.node, choice.cards, memory))
            if work.group is not None:
                group_running[work.group] += 1
            held[work.user] += r.gpus
            team_held[work.team] += r.gpus
            continue
        blocked.setdefault(shape, host_shortage(cluster, r) or _no_room(work))
        reason = blocked[shape]
        search = (shape, level, work.preemptible)
        if freeing and shape not in fits_after:
            fits_after[shape] = _fits_after(cluster, r, freeing)
        if freeing and fits_after[shape]:
            reason = "waiting for preempted work to stop"
        elif search in no_victims:
            pass
        else:
            victims = _choose_victims(cluster, work, level, victims_by_node, run_levels, discipline)
            if not victims:
                no_victims.add(search)
            if victims:
                node = victims[0].node
                fits_after.clear()
                for victim in victims:
                    victim.stopping = True
                    victims_by_node[node].remove(victim)
                    freeing.append(victim)
                    out.preempt.append(Preempt(victim.id, work.id, f"preempted for higher-priority work {work.id}"))
                reason = f"preempting {len(victims)} lower-priority run{'s' if len(victims) != 1 else ''}"
        wait(work, level, reason)
        if discipline.head_of_line_blocking:
            head_blocked = True
    return out


def falls_back(work: Work, now: float) -> bool:
    """Whether spot work should run on-demand from now on: preempted more often than its group
    allows, or its group's deadline has passed (only where the group allows a fallback at all)."""
    if work.fallback_after is not None and work.preemptions > work.fallback_after:
        return True
    return work.fallback_at is not None and now >= work.fallback_at


def _arrivals_by_own_priority(waiting: list[Work], levels: dict) -> dict:
    """A user's priority orders only their own work: in each queue, a user's works take that
    user's arrival times in priority order, so "high" never jumps another user's work."""
    groups: dict[tuple, list[Work]] = defaultdict(list)
    for work in waiting:
        groups[work.user, levels[work.id]].append(work)
    arrival = {}
    for group in groups.values():
        times = sorted(w.submitted for w in group)
        by_priority = sorted(group, key=lambda w: (w.priority, w.submitted, str(w.id)))
        arrival.update((w.id, t) for w, t in zip(by_priority, times, strict=True))
    return arrival


def _over_quota(work, held, team_held, quotas) -> str:
    if quotas is None:
        return ""
    limit = quotas.per_user.get(work.user, quotas.default_user)
    if limit is not None and held[work.user] + work.request.gpus > limit + 1e-9:
        return f"user quota of {limit:g} cards reached"
    team_limit = quotas.per_team.get(work.team) if work.team else None
    if team_limit is not None and team_held[work.team] + work.request.gpus > team_limit + 1e-9:
        return f"team quota of {team_limit:g} cards reached"
    return ""


def _row_fits(cluster: ClusterState, node: int, free, card_mem, cpu: int, mem: int, request) -> bool:
    """Would ``request`` fit on ``node`` if its free capacity were (free, card_mem, cpu, mem)?"""
    if cpu < request.cpu or mem < request.memory_mb:
        return False
    cards = cluster.exists[node] & (free >= request.gpu_milli)
    cards &= card_mem >= cluster.card_mem_total[node] * request.gpu_milli // WHOLE_CARD
    if request.gpu_model is not None:
        cards &= cluster.model[node] == cluster.model_code(request.gpu_model)
    return int(cards.sum()) >= max(request.gpu_count, 1 if request.gpu_milli else 0)


class _NodeRow:
    """One node's free capacity, to try evictions on without copying the cluster."""

    def __init__(self, cluster: ClusterState, node: int):
        self.cluster, self.node = cluster, node
        self.free = cluster.free[node].copy()
        self.card_mem = cluster.card_mem_free[node].copy()
        self.cpu = int(cluster.cpu_free[node])
        self.mem = int(cluster.mem_free[node])

    def give(self, work: Work) -> None:
        r = work.request
        for card in work.cards:
            self.free[card] += r.gpu_milli
            self.card_mem[card] += self.cluster.memory_for(self.node, card, r.gpu_milli)
        self.cpu += r.cpu
        self.mem += r.memory_mb

    def fits(self, request) -> bool:
        return _row_fits(self.cluster, self.node, self.free, self.card_mem, self.cpu, self.mem, request)


def _fits_after(cluster: ClusterState, request, leaving: list[Work]) -> bool:
    """Would the request fit on some node once the given running work has left it?"""
    by_node: dict[int, _NodeRow] = {}
    for work in leaving:
        by_node.setdefault(work.node, _NodeRow(cluster, work.node)).give(work)
    pinned = cluster.node_index.get(request.pinned_node) if request.pinned_node is not None else None
    return any(row.fits(request) for node, row in by_node.items() if pinned is None or node == pinned)


def _choose_victims(cluster, waiter, waiter_level, victims_by_node, run_levels, discipline):
    """The fewest, lowest-priority running works on one node whose eviction lets ``waiter`` fit."""
    best = None
    pinned = waiter.request.pinned_node
    pinned_row = cluster.node_index.get(pinned) if pinned is not None else None
    for node, candidates in victims_by_node.items():
        if pinned is not None and node != pinned_row:
            continue
        allowed = [v for v in candidates if discipline.may_preempt(waiter, waiter_level, v, run_levels[v.id])]
        if not allowed:
            continue
        # Lowest priority first: deepest queue, lowest user priority, least work lost (latest start).
        allowed.sort(key=lambda v: (-run_levels[v.id], -v.priority, -v.started))
        row = _NodeRow(cluster, node)
        chosen = []
        for victim in allowed:
            row.give(victim)
            chosen.append(victim)
            if best is not None and len(chosen) > len(best[1]):
                break
            if row.fits(waiter.request):
                cost = (len(chosen), -sum(run_levels[v.id] for v in chosen))
                if best is None or cost < best[0]:
                    best = (cost, list(chosen))
                break
    return best[1] if best else []
