"""One scheduling decision: which queued work to place where, and which running work to evict.

``decide`` takes plain objects and returns plain decisions with reasons a
person can read; the live tick and the trace simulator call it alike. The
order of queued work and who may evict whom come from a ``Discipline``:
MLFQ (the product), and the FIFO, SRTF and LAS baselines.

Gangs (work across nodes) are placed all or nothing and may evict allowed
victims on several nodes at once; every part of a gang victim is given back.

Reservation and backfill (as Slurm's): multi-card work that does not fit and
has waited ``reserve_after_s`` gets a reservation, at most
``config.reservations`` works at a time in queue order. Its nodes are those
expected to free up earliest: a node's time is when enough of its running work
has ended for the request's share of it (now, if it has that free already),
known only where running work says its ``remaining`` time (the simulator's
oracle); where it is unknown, the nodes with the most free cards now. Work
behind it in the queue backfills only outside the reserved nodes, or on them
when its own ``remaining`` says it ends before the reservation's start. With
no new work landing on them, reserved nodes drain; a waiting work is promoted
to the top queue after ``starvation_s``, so its wait is bounded by
``starvation_s`` plus the running time of what it waits behind on its reserved
nodes, less where it may evict that work.

Elastic work (``Work.elastic_min``..``elastic_max`` cards) starts at its asked size if that fits, else at
``elastic_min`` (admitted at its minimum, as ElasticFlow admits at a job's minimum share). It grows (up to
``elastic_max``, which may exceed the asked size) into idle cards: those still free once every queued
work has had its turn this tick, so no queued work could take them (all of them when nothing waits),
outside reserved nodes; a grow at most once per ``resize_interval_s``. Only its minimum is guaranteed
(ElasticFlow's minimum share): when any queued work does not fit (but spot work never takes on-demand
work's cards), it shrinks if that lets the queued work fit: at once, by at least half its cards (never below
``elastic_min``), so that one restart serves the jobs that arrive after it rather than one restart per
arriving job (each costs the whole job its restart time, the penalty Pollux weighs against a
re-allocation); a job grown to twice its asked size comes back to it. On a node, rigid victims are
evicted before elastic ones: shrinking is elastic work's way of giving cards back. A grow first keeps the
cards it holds and adds members on other nodes (``placement.extend_fit``: what an elastic gang does in place,
members joining it while it runs), and re-places the whole work only where that finds no card; a shrink keeps
its first cards, rank 0's first, so it drops whole members where it can (leaving in place). Whether a resize is
done in place or as a restart from checkpoint with the new world size is the live system's to see
(``services.elastic``): ``Decisions.resize`` carries the new parts, and ``decide`` updates the resized running
``Work`` and the cluster's free capacity.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from scheduler.policy.cluster import WHOLE_CARD, ClusterState
from scheduler.policy.mlfq import MlfqConfig, Work, expected_remaining, level_of
from scheduler.policy.placement import (
    Choice,
    NodeRow,
    Part,
    Request,
    TaskType,
    _eligible,
    _relevant_cards,
    choose_gang,
    choose_parts,
    extend_fit,
    fits_after,
    gang_plan,
    give_parts,
    held_parts,
    is_gang,
    largest_fit,
    take_parts,
)
from scheduler.policy.shortage import host_shortage


@dataclass
class Place:
    """Where queued work starts: ``node``/``cards``/``memory_mb`` are rank 0's part, ``rest`` the others."""

    work_id: object
    node: int  # row in the ClusterState
    cards: list[int]
    memory_mb: list[int]
    rest: list[Part] = field(default_factory=list)

    @property
    def parts(self) -> list[Part]:
        return [Part(self.node, self.cards, self.memory_mb), *self.rest]

    @property
    def gpu_count(self) -> int:
        """Whole cards over every part (elastic work may start below the size it asked)."""
        return sum(len(p.cards) for p in self.parts)


@dataclass
class Resize:
    """Elastic running work restarted from its checkpoint on ``gpu_count`` cards, at ``parts``."""

    work_id: object
    gpu_count: int
    reason: str
    parts: list[Part] = field(default_factory=list)


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
    # Work holding a reservation, with what it holds ("2 nodes (n1, n2) for this 16-card job ...").
    reserved: dict[object, str] = field(default_factory=dict)
    resize: list[Resize] = field(default_factory=list)


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
    # Whether who may evict whom depends only on the waiter's level and spot flag (so it can be cached per tick).
    preempt_by_level = True

    def __init__(self, config: MlfqConfig | None = None):
        self.config = config or MlfqConfig()

    def level(self, work: Work, now: float, *, waiting: bool) -> int:
        return level_of(work, now, self.config, waiting=waiting)

    def key(self, work: Work, level: int, over_share: bool, arrival: float):
        """``arrival``: the work's place in line once its owner's priorities reorder their own work."""
        return (level, over_share, arrival, str(work.id))

    def place_in_line(self, work: Work):
        """Where work stands in its queue before its owner's priorities reorder it: first come first served, or
        with ``config.predict`` the least expected service left first (then first come)."""
        if self.config.predict:
            return (expected_remaining(work, self.config), work.submitted)
        return work.submitted

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
    preempt_by_level = False

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
        super().__init__(replace(config or MlfqConfig(), idle_weight=1.0, fair_share=False))


DISCIPLINES = {d.name: d for d in (Discipline, Fifo, Srtf, Las)}


def _no_room(cluster: ClusterState, request: Request, gang: bool) -> str:
    r = request
    model = r.gpu_model or "GPU"
    if r.nodes is not None and r.nodes > 1:
        return f"no {r.nodes} nodes with {r.gpu_count // r.nodes} free {model} cards each"
    if gang:
        return f"not enough free {model} cards across nodes for this {r.gpu_count}-card job"
    if r.gpu_milli < WHOLE_CARD:
        text = f"no {model} card has {r.gpu_milli / WHOLE_CARD:g} free"
        if _room_of_other_sizes(cluster, r):
            text += " for shares of this size (cards with room serve another size: one share size per card)"
        return text
    if r.gpu_count == 1:
        return f"no free {model} card"
    return f"no node has {r.gpu_count} free {model} cards"


def _room_of_other_sizes(cluster: ClusterState, r: Request) -> bool:
    """Whether some card of the model has the share and memory for the fraction but serves another size."""
    if not cluster.one_size_per_card:
        return False
    relevant = _relevant_cards(cluster, r, slice(None))
    need_memory = cluster.card_mem_total * r.gpu_milli // WHOLE_CARD
    room = relevant & (cluster.free >= r.gpu_milli) & (cluster.card_mem_free >= need_memory)
    return bool((room & ~cluster.joinable(slice(None), r.gpu_milli)).any())


@dataclass
class _Reservation:
    work_id: object
    nodes: np.ndarray  # mask of node rows
    start: float  # when they are expected to be free (inf: unknown)


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
    """Decide one tick. ``cluster`` is the free capacity and is updated for the placements (and resizes) made."""
    discipline = discipline or Discipline()
    config = discipline.config
    out = Decisions()
    for work in waiting:
        if work.spot and falls_back(work, now):
            work.spot = False
            out.on_demand.append(work.id)
    # One pass over the running work (5,000 of it in a busy cluster, every tick): its levels, what each user, team
    # and group holds, the work being evicted (``freeing``) and the elastic work that may shrink or grow.
    run_levels: dict = {}
    wait_levels: dict = {}
    held: dict[str, float] = defaultdict(float)
    team_held: dict[str, float] = defaultdict(float)
    # Members of a group running now, stopping ones too: their containers still run until they stop.
    group_running: dict[object, int] = defaultdict(int)
    freeing: list[Work] = []
    elastic: list[Work] = []
    users: set = set()
    teams: set = set()
    level_of_work = discipline.level
    for is_waiting, works, levels in ((False, running, run_levels), (True, waiting, wait_levels)):
        for work in works:
            level = levels[work.id] = out.levels[work.id] = level_of_work(work, now, waiting=is_waiting)
            if level > work.level:
                out.demoted.append(work.id)
            elif level < work.level:
                out.promoted.append(work.id)
            users.add(work.user)
            if work.team:
                teams.add(work.team)
            if is_waiting:
                continue
            if work.group is not None:
                group_running[work.group] += 1
            if work.stopping:
                freeing.append(work)
                continue
            gpus = work.request.gpus
            held[work.user] += gpus
            team_held[work.team] += gpus
            if work.elastic_min is not None:
                elastic.append(work)

    # Fair share, as Slurm's: an equal share of the cluster per active user, and per active team for work
    # that has one; a user or team at or over its share goes after those under it.
    fair = cluster.total_cards / max(len(users), 1)
    team_fair = cluster.total_cards / max(len(teams), 1)
    fair_share = getattr(config, "fair_share", False)

    # Projected holdings: a user's (and team's) earlier queued work counts against their later work.
    projected, team_projected = defaultdict(float, held), defaultdict(float, team_held)
    keyed = []
    arrival = _arrivals_by_own_priority(waiting, wait_levels, discipline.place_in_line)
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
    victims = _Victims(running, run_levels, discipline)
    ends: dict[int, list] = {}  # per node: (expected end, cards) of its running work, filled on first use
    head_blocked = False
    no_victims: set[tuple] = set()  # (shape, level, preemptible) that found no one to evict this tick
    fits_once_freed: dict[tuple, bool] = {}  # shape -> fits once the work being evicted has left
    reservations: list[_Reservation] = []
    placed_elastic: list[tuple[Place, Work]] = []

    def wait(work: Work, level: int, why: str) -> None:
        positions[level] += 1
        where = f"position {positions[level]} in queue {level}"
        out.waiting[work.id] = Wait(level, positions[level], f"waiting: {why}; {where}")

    def outside_reservations(work: Work) -> tuple[np.ndarray | None, tuple]:
        """Nodes the work may use (None: all) and a key for them: reserved nodes are out unless it ends first."""
        binding = [i for i, res in enumerate(reservations) if not _ends_before(work, now, res.start)]
        if not binding:
            return None, ()
        return ~np.logical_or.reduce([reservations[i].nodes for i in binding]), tuple(binding)

    def place(work: Work, request: Request, choices: list[Choice]) -> None:
        parts = take_parts(cluster, request, choices)
        placed = Place(work.id, parts[0].node, parts[0].cards, parts[0].memory_mb, parts[1:])
        out.place.append(placed)
        if work.elastic_min is not None:
            placed_elastic.append((placed, work))
        if work.group is not None:
            group_running[work.group] += 1
        held[work.user] += request.gpus
        team_held[work.team] += request.gpus

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
        allowed, mask_key = outside_reservations(work)
        sizes = _start_sizes(work)
        for r in sizes:
            gang = is_gang(cluster, r)
            key = (_shape(r), mask_key)
            choices = None if key in blocked else choose_parts(cluster, r, strategy, mix=mix, rng=rng, allowed=allowed)
            if choices is not None:
                place(work, r, choices)
                break
            blocked.setdefault(
                key,
                (host_shortage(cluster, r) or _no_room(cluster, r, gang))
                + (" outside reserved nodes" if mask_key else ""),
            )
        else:
            reason = blocked[key]
            shape = _shape(r)
            search = (shape, level, work.preemptible)
            if freeing and shape not in fits_once_freed:
                fits_once_freed[shape] = fits_after(cluster, r, freeing, strategy)
            if freeing and fits_once_freed[shape]:
                reason = "waiting for preempted work to stop"
            else:
                lent = [w for w in elastic if _may_shrink(work, w)]
                shrunk = _shrink_for(cluster, work, r, lent, now, config, strategy, out, allowed)
                if shrunk:
                    blocked.clear()
                    fits_once_freed.clear()
                    choices = choose_parts(cluster, r, strategy, mix=mix, rng=rng, allowed=allowed)
                    if choices is not None:
                        place(work, r, choices)
                        continue
                if search not in no_victims:
                    allowed_victims = victims.allowed(work, level)
                    if gang:
                        chosen = _choose_gang_victims(cluster, r, allowed_victims)
                    else:
                        chosen = _choose_victims(cluster, r, allowed_victims, run_levels)
                    if not chosen:
                        no_victims.add(search)
                    if chosen:
                        fits_once_freed.clear()
                        for victim in chosen:
                            victim.stopping = True
                            victims.remove(victim)
                            freeing.append(victim)
                            out.preempt.append(
                                Preempt(victim.id, work.id, f"preempted for higher-priority work {work.id}")
                            )
                        reason = f"preempting {len(chosen)} lower-priority run{'s' if len(chosen) != 1 else ''}"
                if not reason.startswith("preempting") and _may_reserve(work, r, now, config, discipline):
                    if len(reservations) < config.reservations:
                        if not ends:
                            ends.update(_ends_by_node(running, now))
                        res = _reserve(cluster, r, work.id, ends, reservations, now)
                        if res is not None:
                            reservations.append(res)
                            reason = _reservation_text(cluster, r, res, now)
                            out.reserved[work.id] = reason
            wait(work, level, reason)
            if discipline.head_of_line_blocking:
                head_blocked = True

    if not head_blocked:
        reserved = np.logical_or.reduce([res.nodes for res in reservations]) if reservations else None
        _grow(cluster, elastic, placed_elastic, now, config, strategy, out, reserved)
    return out


def _shape(r: Request) -> tuple:
    return (r.gpu_model, r.gpu_count, r.gpu_milli, r.cpu, r.memory_mb, r.pinned_node, r.nodes)


def _start_sizes(work: Work) -> list[Request]:
    """The sizes to try, largest first: elastic work starts below its asked size (at its minimum) if it must."""
    r = work.request
    if work.elastic_min is None or work.elastic_min >= r.gpu_count:
        return [r]
    return [r, replace(r, gpu_count=work.elastic_min, nodes=None)]


def _ends_before(work: Work, now: float, start: float) -> bool:
    return work.remaining is not None and now + work.remaining <= start


def _may_reserve(work: Work, request: Request, now: float, config: MlfqConfig, discipline: Discipline) -> bool:
    """Multi-card on-demand work that has waited long enough (FIFO's head blocks everything anyway)."""
    return (
        not discipline.head_of_line_blocking
        and not work.spot
        and request.gpu_count > 1
        and request.gpu_milli == WHOLE_CARD
        and request.pinned_node is None
        and now - work.waiting_since >= config.reserve_after_s
    )


def _ends_by_node(running: list[Work], now: float) -> dict[int, list[tuple[float, int]]]:
    """Per node, (expected end, cards held there) of its running work, soonest first (unknown: inf)."""
    ends: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for work in running:
        end = now + work.remaining if work.remaining is not None else np.inf
        for node, held in work.parts:
            ends[node].append((end, len(held)))
    for items in ends.values():
        items.sort()
    ends.setdefault(-1, [])  # filled, even with nothing running
    return ends


def _reserve(cluster: ClusterState, r: Request, work_id, ends: dict, taken: list, now: float):
    """The nodes the request will take, expected to free up earliest (see the module's text), or None."""
    total = _relevant_cards(cluster, r, slice(None)).sum(axis=1)
    _, cards = _eligible(cluster, r)
    free = cards.sum(axis=1)
    usable = total > 0
    for res in taken:
        usable &= ~res.nodes
    gang = is_gang(cluster, r)
    per = r.gpu_count // r.nodes if r.nodes else (None if gang else r.gpu_count)
    when = np.full(len(total), np.inf)
    for node in np.flatnonzero(usable):
        need = int(total[node] if per is None else min(per, total[node]))
        have = int(free[node])
        when[node] = now if have >= need else np.inf
        for end, count in ends.get(node, ()):
            if have >= need:
                break
            have += count
            when[node] = end
        if have < need:
            when[node] = np.inf
    order = [int(n) for n in np.lexsort((np.arange(len(total)), -free, when)) if usable[n]]
    if per is not None:
        chosen = [n for n in order if total[n] >= per][: r.nodes or 1]
        if len(chosen) < (r.nodes or 1):
            return None
    else:
        chosen, reach = [], 0
        for n in order:
            chosen.append(n)
            reach += int(total[n])
            if reach >= r.gpu_count:
                break
        if reach < r.gpu_count:
            return None
    mask = np.zeros(len(total), dtype=bool)
    mask[chosen] = True
    return _Reservation(work_id, mask, float(max(when[chosen])))


def _reservation_text(cluster: ClusterState, r: Request, res: _Reservation, now: float) -> str:
    nodes = [cluster.node_names[n] for n in np.flatnonzero(res.nodes)]
    count = len(nodes)
    text = f"reserved {count} node{'s' if count != 1 else ''} ({', '.join(nodes)}) for this {r.gpu_count}-card job"
    if np.isfinite(res.start):
        text += f", free in about {max(res.start - now, 0):.0f} s"
    return text + "; smaller work backfills around it"


def falls_back(work: Work, now: float) -> bool:
    """Whether spot work should run on-demand from now on: preempted more often than its group
    allows, or its group's deadline has passed (only where the group allows a fallback at all)."""
    if work.fallback_after is not None and work.preemptions > work.fallback_after:
        return True
    return work.fallback_at is not None and now >= work.fallback_at


def _arrivals_by_own_priority(waiting: list[Work], levels: dict, place_in_line) -> dict:
    """A user's priority orders only their own work: in each queue, a user's works take that
    user's places in line (``place_in_line``: arrival times) in priority order, so "high" never jumps
    another user's work."""
    groups: dict[tuple, list[Work]] = defaultdict(list)
    for work in waiting:
        groups[work.user, levels[work.id]].append(work)
    arrival = {}
    for group in groups.values():
        places = {w.id: place_in_line(w) for w in group}
        times = sorted(places.values())
        by_priority = sorted(group, key=lambda w: (w.priority, places[w.id], str(w.id)))
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


def _trim(parts: list[tuple[int, list[int]]], count: int) -> tuple[list, list, int]:
    """Keep the first ``count`` cards (rank 0's first): (kept parts, dropped cards per node, members dropped)."""
    kept, dropped, members_dropped = [], [], 0
    for node, cards in parts:
        keep = cards[: max(count, 0)]
        count -= len(keep)
        if keep:
            kept.append((node, list(keep)))
        else:
            members_dropped += 1
        if len(keep) < len(cards):
            dropped.append((node, list(cards[len(keep) :]), not keep))
    return kept, dropped, members_dropped


def _give_dropped(cluster: ClusterState, request: Request, dropped: list) -> None:
    """Give back trimmed cards; a member left with none gives back its CPU and memory too."""
    for node, cards, whole_member in dropped:
        cpu, memory = (request.cpu, request.memory_mb) if whole_member else (0, 0)
        cluster.give(node, cards, request.gpu_milli, cpu, memory)


def _resizable(work: Work, now: float, config: MlfqConfig) -> bool:
    return not work.stopping and now - work.resized_at >= config.resize_interval_s


def _apply_resize(work: Work, parts: list[Part], now: float, reason: str, out: Decisions) -> None:
    count = _cards(parts)
    work.request = replace(work.request, gpu_count=count, nodes=None)
    work.node, work.cards = parts[0].node, parts[0].cards
    work.rest = [(p.node, p.cards) for p in parts[1:]]
    work.resized_at = now
    out.resize.append(Resize(work.id, count, reason, parts))


def _may_shrink(waiter: Work, work: Work) -> bool:
    """Elastic work is guaranteed its minimum only: any queued work that does not fit may take back its
    cards above it, whatever their queues, except spot work from on-demand work (spot work never takes
    on-demand cards)."""
    return not (waiter.spot and not work.spot)


def _shrink_for(cluster, waiter: Work, r: Request, elastic: list[Work], now, config, strategy, out, allowed) -> bool:
    """Shrink elastic running work, deepest queue first, by what ``r`` needs and at least half its cards (not
    below its minimum), until ``r`` fits (then it is placed at once); the interval between resizes does not
    hold a shrink back (see the module)."""
    candidates = [w for w in elastic if w.request.gpu_count > w.elastic_min and not w.stopping and w.id != waiter.id]
    if not candidates:
        return False
    candidates.sort(key=lambda w: (-w.level, -w.priority, -w.started, str(w.id)))
    scratch = cluster.copy()
    plan = []
    for work in candidates:
        count = max(work.elastic_min, min(work.request.gpu_count - r.gpu_count, work.request.gpu_count // 2))
        kept, dropped, _ = _trim(work.parts, count)
        _give_dropped(scratch, work.request, dropped)
        plan.append((work, count, kept, dropped))
        if choose_parts(scratch, r, strategy, allowed=allowed) is not None:
            break
    else:
        return False
    for work, count, kept, dropped in plan:
        old = work.request.gpu_count
        _give_dropped(cluster, work.request, dropped)
        parts = held_parts(cluster, kept)
        _apply_resize(work, parts, now, f"shrunk from {old} to {count} cards for queued work {waiter.id}", out)
    return True


def _grow(cluster, elastic: list[Work], placed: list[tuple[Place, Work]], now, config, strategy, out, reserved) -> None:
    """Elastic work grows into idle cards: those still free once every queued work has had its turn this
    tick (no queued work could take them), outside reserved nodes. Work placed this tick grows before it
    starts (no resize); running work grows by members on other nodes where it can (in place), else at a new
    placement (a restart). ``reserved``: mask of reserved nodes or None."""
    allowed = None if reserved is None else ~reserved
    for place, work in placed:
        request = replace(work.request, gpu_count=place.gpu_count, nodes=None)
        current = [(p.node, p.cards) for p in place.parts]
        if reserved is not None and any(reserved[node] for node, _ in current):
            continue
        parts = largest_fit(cluster, request, current, work.elastic_max, strategy, allowed)
        if parts is not None:
            place.node, place.cards, place.memory_mb = parts[0].node, parts[0].cards, parts[0].memory_mb
            place.rest = parts[1:]
    for work in sorted(elastic, key=lambda w: (w.level, w.started, str(w.id))):
        if work.request.gpu_count >= (work.elastic_max or 0) or not _resizable(work, now, config):
            continue
        if reserved is not None and any(reserved[node] for node, _ in work.parts):
            continue
        old = work.request.gpu_count
        args = (work.request, work.parts, work.elastic_max, strategy, allowed)
        if work.request.pinned_node is None:  # (work that keeps to its node grows there or not at all)
            # In place (members join) where that grows it as much as a new placement would: each tried on a
            # scratch copy, the one kept adopted.
            in_place, placed = cluster.copy(), cluster.copy()
            parts, other = extend_fit(in_place, *args), largest_fit(placed, *args)
            if parts is None or (other is not None and _cards(parts) < _cards(other)):
                parts, in_place = other, placed
            if parts is not None:
                cluster.adopt(in_place)
        else:
            parts = largest_fit(cluster, *args)
        if parts is not None:
            _apply_resize(work, parts, now, f"grown from {old} to {_cards(parts)} cards into idle capacity", out)


def _cards(parts: list[Part]) -> int:
    return sum(len(p.cards) for p in parts)


def _victim_order(victim: Work, run_levels: dict):
    """Rigid work before elastic work (which shrinks instead), then lowest priority first: deepest queue,
    lowest user priority, least work lost (latest start)."""
    return (victim.elastic_min is not None, -run_levels[victim.id], -victim.priority, -victim.started)


class _Victims:
    """Running work that may still be evicted this tick, by node (a gang on each of its nodes)."""

    def __init__(self, running: list[Work], run_levels: dict, discipline: Discipline):
        self.running, self.run_levels, self.discipline = running, run_levels, discipline
        self.cache: dict[tuple, dict] = {}

    @cached_property
    def by_node(self) -> dict[int, list[Work]]:
        """Built when first asked (most ticks evict no one: a pass over 5,000 running works for nothing)."""
        by_node: dict[int, list[Work]] = defaultdict(list)
        for work in self.running:
            if not work.stopping:
                for node, _ in work.parts:
                    by_node[node].append(work)
        return by_node

    def remove(self, victim: Work) -> None:
        for node, _ in victim.parts:
            if victim in self.by_node[node]:
                self.by_node[node].remove(victim)
        self.cache.clear()

    def allowed(self, waiter: Work, level: int) -> dict[int, list[Work]]:
        """Per node, the work ``waiter`` may evict, lowest priority first."""
        key = (waiter.spot, level) if self.discipline.preempt_by_level else None
        if key in self.cache:
            return self.cache[key]
        result = {}
        for node, candidates in self.by_node.items():
            allowed = [v for v in candidates if self.discipline.may_preempt(waiter, level, v, self.run_levels[v.id])]
            if allowed:
                result[node] = sorted(allowed, key=lambda v: _victim_order(v, self.run_levels))
        if key is not None:
            self.cache[key] = result
        return result


def _choose_victims(cluster, request: Request, allowed: dict, run_levels: dict) -> list[Work]:
    """The fewest, lowest-priority running works on one node whose eviction lets ``request`` fit."""
    best = None
    pinned = request.pinned_node
    pinned_row = cluster.node_index.get(pinned) if pinned is not None else None
    for node, candidates in allowed.items():
        if pinned is not None and node != pinned_row:
            continue
        row = NodeRow(cluster, node)
        chosen = []
        for victim in candidates:
            row.give(victim)
            chosen.append(victim)
            if best is not None and len(chosen) > len(best[1]):
                break
            if row.fits(request):
                cost = (len(chosen), -sum(run_levels[v.id] for v in chosen))
                if best is None or cost < best[0]:
                    best = (cost, list(chosen))
                break
    return best[1] if best else []


def _choose_gang_victims(cluster, request: Request, allowed: dict) -> list[Work]:
    """Running works on several nodes whose eviction lets the gang fit, all of them or none.

    The nodes are planned as placement plans them, on what each node would have free if every victim
    allowed there left; on each, the lowest-priority victims go first until its member's cards are free.
    """
    if not allowed:
        return []
    relevant = _relevant_cards(cluster, request, slice(None))
    whole = (relevant & (cluster.free == WHOLE_CARD)).sum(axis=1)
    freeable = whole.copy()
    for node, victims in allowed.items():
        freeable[node] += sum(len(cards) for v in victims for n, cards in v.parts if n == node)
    plan = gang_plan(freeable, relevant.sum(axis=1), cluster.group, request)
    if plan is None:
        return []
    scratch = cluster.copy()
    chosen: list[Work] = []
    for node, count in plan:
        for victim in allowed.get(node, []):
            if int((relevant[node] & (scratch.free[node] == WHOLE_CARD)).sum()) >= count:
                break
            if victim not in chosen:
                give_parts(scratch, victim.request, victim.parts)
                chosen.append(victim)
    return chosen if choose_gang(scratch, request) is not None else []
