"""Where one request goes: first fit, best fit, random, or fragmentation-aware (FGD).

Rules shared by every strategy: only cards of the requested model (or any,
when none is asked for); multi-card work takes whole cards; a fraction joins
only an empty card or one already serving fractions of its size (one share
size per card: ``cluster``); GPU share, GPU memory, CPU and host memory are
checked together.

Work wider than any node of its model (or that asks for ``nodes`` > 1) is a
gang: ``choose_gang`` places all of it or none, on the fewest nodes, whole
(fully free) nodes first and then the best-fitting partial node, inside one
node group (rack) when one can hold it with no more nodes than the best plan
overall. CPU and memory are per member (per node). Work that fits on one node
never spreads over several by itself: it waits for one node (``nodes`` asks
for a spread explicitly).

FGD (Weng et al., "Beware of Fragmentation", USENIX ATC'23) scores a
placement by how much it grows the cluster's expected fragmentation for a
target mix of task types: a card's free share is a fragment for a task type
when that type could not use it (too small a share, a card serving another
share size, the node cannot host the type at all, or the type uses no card). Among the candidates that grow
fragmentation by no more than FGD_TOLERANCE over the least, best fit wins.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from scheduler.policy import fgd_few
from scheduler.policy.cluster import NO_CLASS, WHOLE_CARD, ClusterState, joinable

if TYPE_CHECKING:
    from scheduler.policy.mlfq import Work

STRATEGIES = ("fgd", "bestfit", "firstfit", "random")
DEDUPE_ABOVE = 64  # candidate sets larger than this are scored once per distinct state
# Fragmentation growth (thousandths of a card) within which candidates count as equally good, so the
# tie goes to best fit. Exact FGD (0) packs worse: on the openb trace 95.0% allocated against 95.5% for
# 10..80 (bench/fgd_allocation.py); the reference artifact gets the same effect from integer scores.
FGD_TOLERANCE = 10


@dataclass(frozen=True)
class Request:
    id: object
    gpu_model: str | None
    gpu_count: int = 1
    gpu_milli: int = WHOLE_CARD
    cpu: int = 0
    memory_mb: int = 0
    pinned_node: object = None
    # GB of disk it reserves on a node it is placed on (its data and system disks): 0 where it has them already.
    disk_gb: int = 0
    # Gangs: None = one node if the work fits on one, else the fewest nodes the policy finds; an int =
    # exactly that many nodes with gpu_count / nodes cards each. cpu and memory_mb are per member.
    nodes: int | None = None

    def __post_init__(self):
        if self.nodes is None:
            return
        if self.nodes < 1:
            raise ValueError(f"Request.nodes: must be at least 1, got {self.nodes}")
        if self.gpu_count % self.nodes:
            raise ValueError(f"Request.nodes: {self.gpu_count} cards do not split evenly over {self.nodes} nodes")
        if self.nodes > 1 and self.gpu_milli != WHOLE_CARD:
            raise ValueError("Request.nodes: work across nodes takes whole cards (gpu_milli 1000)")

    @cached_property
    def gpus(self) -> float:
        """Cards' worth of share held (read for every running work at every simulated event)."""
        return self.gpu_count * self.gpu_milli / WHOLE_CARD


@dataclass(frozen=True)
class TaskType:
    """One kind of request in the expected workload mix, with its weight."""

    gpu_count: int
    gpu_milli: int
    cpu: int
    memory_mb: int
    weight: float


def task_mix(shapes: Iterable[tuple[int, int, int, int]]) -> list[TaskType]:
    """FGD's expected workload: each distinct (cards, thousandths per card, CPU, memory) weighted by its count."""
    counts = Counter((count, milli if count else 0, cpu, memory) for count, milli, cpu, memory in shapes)
    return [TaskType(count, milli, cpu, memory, n) for (count, milli, cpu, memory), n in counts.items()]


@dataclass
class Choice:
    node: int
    cards: list[int]


def _eligible_nodes(cluster: ClusterState, request: Request, allowed: np.ndarray | None = None) -> np.ndarray:
    nodes = (cluster.cpu_free >= request.cpu) & (cluster.mem_free >= request.memory_mb)
    nodes &= cluster.disk_free >= request.disk_gb
    kept = _kept_to(cluster, request, allowed)
    return nodes if kept is None else nodes & kept


def _kept_to(cluster: ClusterState, request: Request, allowed: np.ndarray | None) -> np.ndarray | None:
    """The nodes the request may go to whatever their room (``allowed``, and its pinned node), None for all: FGD's
    cached scores already say which nodes have the room (+inf where not), as of the node's version."""
    if request.pinned_node is None:
        return allowed
    pinned = np.zeros(len(cluster.node_ids), dtype=bool)
    index = cluster.node_index.get(request.pinned_node)
    if index is not None:
        pinned[index] = True
    return pinned if allowed is None else pinned & allowed


def _eligible_cards(cluster: ClusterState, request: Request, rows=slice(None), relevant=None) -> np.ndarray:
    """Cards (of the given node rows) that could take the request's share, ignoring host CPU/memory: free
    share and memory enough, and for a fraction an empty card or one of its size (``ClusterState``)."""
    if relevant is None:
        relevant = _relevant_cards(cluster, request, rows)
    need_memory = cluster.card_mem_total[rows] * request.gpu_milli // WHOLE_CARD
    fits = relevant & (cluster.free[rows] >= request.gpu_milli) & (cluster.card_mem_free[rows] >= need_memory)
    return fits & cluster.joinable(rows, request.gpu_milli)


def _eligible(cluster: ClusterState, request: Request, allowed=None) -> tuple[np.ndarray, np.ndarray]:
    """(node mask, card mask) of what could host the request on its own terms."""
    nodes = _eligible_nodes(cluster, request, allowed)
    return nodes, _eligible_cards(cluster, request) & nodes[:, None]


def _fraction_choice(node: int, card: int) -> Choice:
    return Choice(int(node), [int(card)])


def _whole_choice(cards: np.ndarray, node: int, count: int) -> Choice:
    return Choice(int(node), [int(c) for c in np.flatnonzero(cards[node])[:count]])


def choose(
    cluster: ClusterState,
    request: Request,
    strategy: str = "fgd",
    *,
    mix: list[TaskType] | None = None,
    rng: np.random.Generator | None = None,
    allowed: np.ndarray | None = None,
) -> Choice | None:
    """The node and cards for one request under ``strategy``, or None if nothing fits now.

    ``allowed``: node mask to keep to (others are reserved), None for every node.
    """
    if strategy == "fgd" and mix:
        return _fgd_choose(cluster, request, _kept_to(cluster, request, allowed), mix)
    nodes, cards = _eligible(cluster, request, allowed)
    fraction = 0 < request.gpu_milli < WHOLE_CARD
    if fraction:
        rows, cols = np.nonzero(cards)
        if rows.size == 0:
            return None
        if strategy == "firstfit":
            return _fraction_choice(rows[0], cols[0])
        if strategy == "random":
            pick = (rng or np.random.default_rng()).integers(rows.size)
            return _fraction_choice(rows[pick], cols[pick])
        best = int(np.argmin(cluster.free[rows, cols] - request.gpu_milli))
        return _fraction_choice(rows[best], cols[best])

    count_per_node = cards.sum(axis=1)
    candidates = np.flatnonzero(nodes & (count_per_node >= request.gpu_count))
    if candidates.size == 0:
        return None
    if strategy == "firstfit":
        return _whole_choice(cards, candidates[0], request.gpu_count)
    if strategy == "random":
        node = candidates[(rng or np.random.default_rng()).integers(candidates.size)]
        return _whole_choice(cards, node, request.gpu_count)
    best = int(np.argmin(count_per_node[candidates] - request.gpu_count))
    return _whole_choice(cards, candidates[best], request.gpu_count)


def is_gang(cluster: ClusterState, request: Request) -> bool:
    """Whether the request spans nodes: it asks for more than one, or is wider than any node of its model."""
    if request.nodes is not None:
        return request.nodes > 1
    return request.gpu_count > 1 and request.gpu_count > cluster.width(request.gpu_model)


def choose_parts(cluster: ClusterState, request: Request, strategy: str = "fgd", **options) -> list[Choice] | None:
    """Every member's node and cards (rank 0 first): one for single-node work, several for a gang.

    ``options`` are ``choose``'s (mix, rng, allowed); a gang uses only ``allowed``.
    """
    if is_gang(cluster, request):
        return choose_gang(cluster, request, options.get("allowed"))
    choice = choose(cluster, request, strategy, **options)
    return None if choice is None else [choice]


def choose_gang(cluster: ClusterState, request: Request, allowed: np.ndarray | None = None) -> list[Choice] | None:
    """All members of a gang, or None when the whole gang does not fit now (nothing is held half-placed)."""
    nodes, cards = _eligible(cluster, request, allowed)
    free = np.where(nodes, cards.sum(axis=1), 0)
    total = _relevant_cards(cluster, request, slice(None)).sum(axis=1)
    plan = gang_plan(free, total, cluster.group, request)
    if plan is None:
        return None
    return [Choice(node, [int(c) for c in np.flatnonzero(cards[node])[:count]]) for node, count in plan]


def gang_plan(free: np.ndarray, total: np.ndarray, groups: np.ndarray, request: Request) -> list | None:
    """(node, cards) per member given each node's usable cards ``free`` (of ``total``), or None.

    Fewest nodes first; inside one group when a group can hold the gang on no more nodes than the
    best plan over every node (ties: the group left with the least unused capacity on the chosen nodes).
    """
    everywhere = _plan_within(free, total, np.arange(len(free)), request)
    if everywhere is None:
        return None
    best, best_key = everywhere, None
    for group in np.unique(groups[groups >= 0]):
        plan = _plan_within(free, total, np.flatnonzero(groups == group), request)
        if plan is None or len(plan) > len(everywhere):
            continue
        key = (len(plan), sum(int(free[n]) - c for n, c in plan))
        if best_key is None or key < best_key:
            best, best_key = plan, key
    return best


def _plan_within(free: np.ndarray, total: np.ndarray, members: np.ndarray, request: Request) -> list | None:
    if request.nodes is not None:
        per = request.gpu_count // request.nodes
        fit = members[free[members] >= per]
        if fit.size < request.nodes:
            return None
        # Best fit: the least left over, so whole nodes go to gangs that fill them.
        fit = fit[np.lexsort((fit, free[fit] - per))]
        return [(int(n), per) for n in fit[: request.nodes]]
    # The fewest nodes: most free first (fully free nodes ahead of partial ones with as many free cards).
    order = members[np.lexsort((members, ~(free[members] == total[members]), -free[members]))]
    order = order[free[order] > 0]
    reach = np.cumsum(free[order])
    if reach.size == 0 or reach[-1] < request.gpu_count:
        return None
    k = int(np.searchsorted(reach, request.gpu_count)) + 1
    taken = [(int(n), int(free[n])) for n in order[: k - 1]]
    rest = request.gpu_count - sum(c for _, c in taken)
    # The last member goes to the best-fitting node left: the fewest free cards that still hold the rest.
    left = order[k - 1 :]
    left = left[free[left] >= rest]
    last = left[np.lexsort((left, free[left]))][0]
    return [*taken, (int(last), rest)]


@dataclass
class _Scores:
    """Best FGD score per node for one request shape, valid while the node's version is unchanged."""

    mix: list
    versions: np.ndarray
    delta: np.ndarray  # +inf where the node cannot host the request
    tiebreak: np.ndarray  # best fit: share (or whole cards) left over
    card: np.ndarray  # best card for a fraction


def _fgd_choose(cluster: ClusterState, request: Request, allowed_nodes: np.ndarray | None, mix) -> Choice | None:
    """FGD over every node (``allowed_nodes``: those it may use, None for all), rescoring only nodes whose capacity
    changed since this shape was last scored."""
    shape = (request.gpu_model, request.gpu_count, request.gpu_milli, request.cpu, request.memory_mb, request.disk_gb)
    scores = cluster.score_cache.get(shape)
    count = len(cluster.node_ids)
    if scores is None or scores.mix is not mix:
        other = [key for key, kept in cluster.score_cache.items() if isinstance(kept, _Scores) and kept.mix is not mix]
        for key in other:  # scores of another mix are not used again (a state kept across ticks keeps its cache)
            del cluster.score_cache[key]
        scores = _Scores(mix, np.full(count, -1), np.full(count, np.inf), np.zeros(count), np.zeros(count, np.int64))
        cluster.score_cache[shape] = scores
    stale = np.flatnonzero(scores.versions != cluster.version)
    if stale.size:
        _rescore(cluster, request, _cached_mix_arrays(cluster, mix), stale, scores)
        scores.versions[stale] = cluster.version[stale]
    # +inf where the node has no room (as scored at its version: ``_rescore``) or may not be used.
    delta = scores.delta if allowed_nodes is None else np.where(allowed_nodes, scores.delta, np.inf)
    least = delta.min(initial=np.inf)  # no node at all: +inf too
    if not np.isfinite(least):
        return None
    candidates = np.flatnonzero(delta <= least + FGD_TOLERANCE)
    node = candidates[np.argmin(scores.tiebreak[candidates])]  # the first (lowest index) of the best fits
    if 0 < request.gpu_milli < WHOLE_CARD:
        return _fraction_choice(node, scores.card[node])
    cards = _eligible_cards(cluster, request, [node])[0]
    return Choice(int(node), [int(c) for c in np.flatnonzero(cards)[: request.gpu_count]])


def _rescore(cluster: ClusterState, request: Request, mix: _MixArrays, stale: np.ndarray, scores: _Scores) -> None:
    """Recompute the best score of each stale node (pinning is applied by the caller, not cached): a few nodes in
    plain Python (``fgd_few``: the same scores, without numpy's cost per call), more over the arrays."""
    if mix.rows is not None and stale.size <= fgd_few.FEW_NODES:
        fgd_few.rescore(cluster, request, mix.rows, stale, scores.delta, scores.tiebreak, scores.card)
        return
    scores.delta[stale] = np.inf
    room = (cluster.cpu_free[stale] >= request.cpu) & (cluster.mem_free[stale] >= request.memory_mb)
    hosts = stale[room & (cluster.disk_free[stale] >= request.disk_gb)]
    if hosts.size == 0:
        return
    relevant = _relevant_cards(cluster, request, hosts)
    cards = _eligible_cards(cluster, request, hosts, relevant)
    if 0 < request.gpu_milli < WHOLE_CARD:
        local_rows, cols = np.nonzero(cards)
        if local_rows.size == 0:
            return
        rows = hosts[local_rows]
        delta = _fgd_delta_fraction(cluster, request, rows, cols, relevant[local_rows], mix)
        leftover = cluster.free[rows, cols] - request.gpu_milli
        order = np.lexsort((cols, leftover, delta, rows))  # each node's best card first
        rows, cols, delta, leftover = rows[order], cols[order], delta[order], leftover[order]
        first = _run_starts(rows)
        best_rows = rows[first]
        scores.delta[best_rows] = delta[first]
        scores.tiebreak[best_rows] = leftover[first]
        scores.card[best_rows] = cols[first]
        return
    whole = cards.sum(axis=1)
    fit = whole >= request.gpu_count
    if not fit.any():
        return
    scores.delta[hosts[fit]] = _fgd_delta_whole(cluster, request, hosts[fit], relevant[fit], mix)
    scores.tiebreak[hosts[fit]] = whole[fit] - request.gpu_count


def _run_starts(sorted_values: np.ndarray) -> np.ndarray:
    """Index of the first element of each run of equal values."""
    change = np.empty(sorted_values.size, dtype=bool)
    change[:1] = True
    np.not_equal(sorted_values[1:], sorted_values[:-1], out=change[1:])
    return np.flatnonzero(change)


def _cached_mix_arrays(cluster: ClusterState, mix: list[TaskType]) -> _MixArrays:
    """The mix as arrays, built once per mix object and kept with the cluster's other cached scores."""
    cached = cluster.score_cache.get("mix")
    if cached is None or cached[0] is not mix:
        cached = cluster.score_cache["mix"] = (mix, _mix_arrays(mix))
    return cached[1]


class _MixArrays(NamedTuple):
    # Counts (integers) where every weight is a whole number, as ``task_mix`` gives them: a node's fragmentation
    # is then an exact integer, divided by ``total`` once per score; otherwise the weights as given.
    weights: np.ndarray
    total: float
    milli: np.ndarray
    count: np.ndarray
    cpu: np.ndarray
    mem: np.ndarray
    fraction: np.ndarray  # types asking for part of one card
    uses_card: np.ndarray
    # The distinct shares the fraction types ask for (a placeholder whole card when none does), and each
    # type's index into them: per-card terms are computed once per share size, not once per type.
    sizes: np.ndarray
    size_of: np.ndarray
    rows: fgd_few.MixRows | None  # the same as plain values, where the weights are counts (``fgd_few``)


def _mix_arrays(mix: list[TaskType]) -> _MixArrays:
    weights = np.array([t.weight for t in mix], dtype=np.float64)
    counts = all(float(t.weight).is_integer() for t in mix) and weights.sum() < 2**31
    if counts:
        weights = weights.astype(np.int64)
    milli = np.array([t.gpu_milli for t in mix], dtype=np.int64)
    count = np.array([t.gpu_count for t in mix], dtype=np.int64)
    cpu = np.array([t.cpu for t in mix], dtype=np.int64)
    memory = np.array([t.memory_mb for t in mix], dtype=np.int64)
    fraction = (milli > 0) & (milli < WHOLE_CARD)
    sizes = np.unique(milli[fraction]) if fraction.any() else np.array([WHOLE_CARD])
    size_of = np.where(fraction, np.searchsorted(sizes, milli), 0)
    total = weights.sum().item()
    rows = None
    if counts:
        types = zip(weights, count > 0, fraction, size_of, count, cpu, memory, strict=True)
        rows = fgd_few.MixRows(tuple(sizes.tolist()), tuple(tuple(t.item() for t in typ) for typ in types), total)
    return _MixArrays(weights, total, milli, count, cpu, memory, fraction, count > 0, sizes, size_of, rows)


def _fragmentation(total, fragsum, whole, usable, cpu, mem, mix: _MixArrays) -> np.ndarray:
    """Expected fragmentation of node states (rows) over the task mix (columns summed by weight), times the
    weights' total (``mix.total``): exact integers where the weights are counts.

    total: free share of the node; fragsum[:, s]: free share on cards a fraction of size s (``mix.sizes``)
    cannot use (too small a share left, or a card of another share size); whole: whole free cards;
    usable[:, s]: cards a fraction of size s could join; cpu/mem: free CPU and memory.
    """
    fits_host = (cpu[:, None] >= mix.cpu) & (mem[:, None] >= mix.mem)
    fits_gpu = np.where(mix.fraction, usable[:, mix.size_of] > 0, whole[:, None] >= mix.count)
    unusable = np.where(mix.fraction, fragsum[:, mix.size_of], (total - WHOLE_CARD * whole)[:, None])
    usable_node = fits_host & fits_gpu & mix.uses_card  # to work that uses no card, every free share is a fragment
    frag = np.where(usable_node, unusable, total[:, None])
    return frag @ mix.weights


def fragmentation(cluster: ClusterState, mix: list[TaskType]) -> float:
    """The cluster's expected fragmentation for ``mix`` (FGD's measure), in cards: free share that the
    mix's task types could not use, weighted by how often each type comes (cards of any model)."""
    arrays = _mix_arrays(mix)
    rule = cluster.one_size_per_card
    total, whole, fragsum, usable = _node_stats_sub(cluster.free, _classes(cluster), cluster.exists, arrays, rule)
    frag = _fragmentation(total, fragsum, whole, usable, cluster.cpu_free, cluster.mem_free, arrays)
    return float(frag.sum()) / arrays.total / WHOLE_CARD


def _card_terms(free, card_class, mix: _MixArrays, rule: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per card (any leading shape) and share size of the mix: (free share a fraction of that size cannot
    use, whether it can join the card)."""
    f = free[..., None]
    fits = f >= mix.sizes
    if rule:
        c = card_class[..., None]
        fits &= (c == 0) | (c == mix.sizes)
    return np.where(fits, 0, f), fits


def _growth(before: tuple, after: tuple, mix: _MixArrays) -> np.ndarray:
    """Fragmentation after minus before, for node states given as (total, fragsum, whole, usable, cpu, mem)."""
    both = _fragmentation(*(np.concatenate(pair) for pair in zip(before, after, strict=True)), mix)
    half = len(before[0])
    return _exact((both[half:] - both[:half]) / mix.total)


def _fgd_delta_fraction(cluster, request, rows, cols, relevant, mix: _MixArrays) -> np.ndarray:
    """Growth in expected fragmentation for placing a fraction on each candidate (row, col) card.

    Candidates whose node state and card are alike score alike, so each distinct
    (sorted free shares and classes, free CPU, free memory, chosen card's share and class) is scored once.
    """
    classes = _classes(cluster)
    distinct = _distinct(cluster, rows, relevant, cluster.free[rows, cols], classes[rows, cols])
    if distinct is not None:
        rows, cols, relevant = rows[distinct[0]], cols[distinct[0]], relevant[distinct[0]]
    rule = cluster.one_size_per_card
    total, whole, fragsum, usable = _node_stats_sub(cluster.free[rows], classes[rows], relevant, mix, rule)
    cpu, mem = cluster.cpu_free[rows], cluster.mem_free[rows]
    f = cluster.free[rows, cols]
    # The chosen card before and after (its share taken, its class the request's), in one pass.
    lost, fits = _card_terms(
        np.column_stack([f, f - request.gpu_milli]),
        np.column_stack([classes[rows, cols], np.full_like(f, request.gpu_milli)]),
        mix,
        rule,
    )
    after = (
        total - request.gpu_milli,
        fragsum - lost[:, 0] + lost[:, 1],
        whole - (f == WHOLE_CARD),
        usable - fits[:, 0] + fits[:, 1],
        cpu - request.cpu,
        mem - request.memory_mb,
    )
    growth = _growth((total, fragsum, whole, usable, cpu, mem), after, mix)
    return growth if distinct is None else growth[distinct[1]]


def _relevant_cards(cluster: ClusterState, request: Request, rows) -> np.ndarray:
    """Card slots of the given node rows that exist and are of the requested model."""
    relevant = cluster.exists[rows].copy()  # a slice would be a view: callers narrow this in place
    if request.gpu_model is not None:
        relevant &= cluster.model[rows] == cluster.model_code(request.gpu_model)
    return relevant


def _classes(cluster: ClusterState) -> np.ndarray:
    """The cards' classes as placement scores them: all alike where fractions of any sizes may mix."""
    if cluster.one_size_per_card:
        return cluster.card_class
    return np.zeros_like(cluster.card_class)


def _distinct(cluster: ClusterState, rows: np.ndarray, relevant: np.ndarray, *extra) -> tuple | None:
    """(first of each distinct candidate state, map from every candidate to it); None (all) for small sets.

    A state is the node's sorted (free share, class) pairs, free CPU and memory, plus ``extra`` columns.
    """
    if rows.size <= DEDUPE_ABOVE:
        return None
    # One number per card: its free share and its class (-1 .. WHOLE_CARD) side by side; -1 for no card.
    cards = cluster.free[rows] * (2 * WHOLE_CARD + 2) + _classes(cluster)[rows] + 1
    frees = np.sort(np.where(relevant, cards, -1), axis=1)
    keys = np.column_stack([frees, cluster.cpu_free[rows], cluster.mem_free[rows], *extra])
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    return first, inverse.ravel()


def _exact(delta: np.ndarray) -> np.ndarray:
    """Round away float noise: equal states must score exactly equal so the best-fit tie-break decides."""
    return np.round(delta, 6)


def _node_stats_sub(free_rows, class_rows, relevant_rows, mix: _MixArrays, rule: bool):
    """(total free share, whole free cards, fragsum, usable) of node rows, as ``_fragmentation`` takes them."""
    free = np.where(relevant_rows, free_rows, 0)
    total = free.sum(axis=1)
    whole = (relevant_rows & (free_rows == WHOLE_CARD)).sum(axis=1)
    lost, fits = _card_terms(free, class_rows, mix, rule)
    fits &= relevant_rows[:, :, None]
    return total, whole, lost.sum(axis=1), fits.sum(axis=1)


def _fgd_delta_whole(cluster, request, nodes, relevant, mix: _MixArrays) -> np.ndarray:
    """Growth in expected fragmentation for placing whole cards on each candidate node (alike nodes scored once)."""
    distinct = _distinct(cluster, nodes, relevant)
    if distinct is not None:
        nodes, relevant = nodes[distinct[0]], relevant[distinct[0]]
    rule = cluster.one_size_per_card
    total, whole, fragsum, usable = _node_stats_sub(cluster.free[nodes], _classes(cluster)[nodes], relevant, mix, rule)
    cpu, mem = cluster.cpu_free[nodes], cluster.mem_free[nodes]
    # Each card taken was whole and of no class (usable by every type that fits a card); it is left with nothing.
    _, fits_whole = _card_terms(np.array(WHOLE_CARD), np.array(0), mix, rule)
    after = (
        total - WHOLE_CARD * request.gpu_count,
        fragsum,
        whole - request.gpu_count,
        usable - request.gpu_count * fits_whole,
        cpu - request.cpu,
        mem - request.memory_mb,
    )
    growth = _growth((total, fragsum, whole, usable, cpu, mem), after, mix)
    return growth if distinct is None else growth[distinct[1]]


# --- what fits where: capacity given and taken, fits after evictions, the largest size that fits ---


@dataclass
class Part:
    """One member of a placement: its node row, card columns and the GPU memory taken on each card."""

    node: int
    cards: list[int]
    memory_mb: list[int]


def give_parts(cluster: ClusterState, request: Request, parts) -> None:
    for node, cards in parts:
        cluster.give(node, cards, request.gpu_milli, request.cpu, request.memory_mb, request.disk_gb)


def take_parts(cluster: ClusterState, request: Request, choices: list[Choice]) -> list[Part]:
    r = request
    return [
        Part(c.node, c.cards, cluster.take(c.node, c.cards, r.gpu_milli, r.cpu, r.memory_mb, r.disk_gb))
        for c in choices
    ]


def largest_fit(cluster, request: Request, parts, most: int, strategy: str, allowed=None) -> list[Part] | None:
    """Re-place work holding ``parts`` at the largest size up to ``most`` that fits; None if it cannot grow."""
    scratch = cluster.copy()
    give_parts(scratch, request, parts)
    best = _most_that_fits(scratch, request, request.gpu_count, most, strategy, allowed)
    if best is None:
        return None
    give_parts(cluster, request, parts)
    return take_parts(cluster, replace(request, gpu_count=best[0], nodes=None), best[1])


def extend_fit(cluster, request: Request, parts, most: int, strategy: str, allowed=None) -> list[Part] | None:
    """Grow work holding ``parts`` in place: the same cards on the same nodes (rank 0's first) and new members
    on other nodes, up to ``most`` cards in all; None if no other node can take any. What an elastic gang can
    do without a restart: members join it (``services.elastic``)."""
    mask = np.ones(len(cluster.free), dtype=bool) if allowed is None else allowed.copy()
    for node, _ in parts:
        mask[node] = False
    best = _most_that_fits(cluster, request, 0, most - sum(len(cards) for _, cards in parts), strategy, mask)
    if best is None:
        return None
    return held_parts(cluster, parts) + take_parts(cluster, replace(request, gpu_count=best[0], nodes=None), best[1])


def held_parts(cluster, parts) -> list[Part]:
    """Whole cards held as they are ((node, cards) each) as ``Part``s, with each card's memory."""
    return [
        Part(node, list(cards), [cluster.memory_for(node, card, WHOLE_CARD) for card in cards]) for node, cards in parts
    ]


def _most_that_fits(cluster, request: Request, low: int, high: int, strategy: str, allowed):
    """(count, choices) for the largest count above ``low`` and up to ``high`` that fits, or None (a binary
    search: fitting is monotone in the count)."""
    best = None
    while low < high:
        mid = (low + high + 1) // 2
        choices = choose_parts(cluster, replace(request, gpu_count=mid, nodes=None), strategy, allowed=allowed)
        if choices is not None:
            low, best = mid, (mid, choices)
        else:
            high = mid - 1
    return best


def row_fits(cluster: ClusterState, node: int, free, card_mem, card_class, cpu: int, mem: int, request) -> bool:
    """Would ``request`` fit on ``node`` if its free capacity were (free, card_mem, card_class, cpu, mem)? Its free
    disk is the cluster's: work that leaves keeps its disks there (a stopped instance, a requeued job)."""
    if cpu < request.cpu or mem < request.memory_mb or cluster.disk_free[node] < request.disk_gb:
        return False
    cards = cluster.exists[node] & (free >= request.gpu_milli)
    cards &= card_mem >= cluster.card_mem_total[node] * request.gpu_milli // WHOLE_CARD
    cards &= joinable(card_class, request.gpu_milli, cluster.one_size_per_card)
    if request.gpu_model is not None:
        cards &= cluster.model[node] == cluster.model_code(request.gpu_model)
    return int(cards.sum()) >= max(request.gpu_count, 1 if request.gpu_milli else 0)


class NodeRow:
    """One node's free capacity, to try evictions on without copying the cluster."""

    def __init__(self, cluster: ClusterState, node: int):
        self.cluster, self.node = cluster, node
        self.free = cluster.free[node].copy()
        self.card_mem = cluster.card_mem_free[node].copy()
        self.card_class = cluster.card_class[node].copy()
        self.cpu = int(cluster.cpu_free[node])
        self.mem = int(cluster.mem_free[node])

    def give(self, work: Work) -> None:
        """Give back the work's part on this node (a gang's other parts are on other rows); a card it
        empties takes any share size again."""
        r = work.request
        for node, cards in work.parts:
            if node != self.node:
                continue
            for card in cards:
                self.free[card] += r.gpu_milli
                self.card_mem[card] += self.cluster.memory_for(self.node, card, r.gpu_milli)
                if self.free[card] >= WHOLE_CARD:
                    self.card_class[card] = NO_CLASS
            self.cpu += r.cpu
            self.mem += r.memory_mb

    def fits(self, request) -> bool:
        return row_fits(self.cluster, self.node, self.free, self.card_mem, self.card_class, self.cpu, self.mem, request)


def fits_after(cluster: ClusterState, request, leaving: list[Work], strategy: str = "bestfit") -> bool:
    """Would the request fit once the given running work has left (every part of it)?"""
    if is_gang(cluster, request):
        scratch = cluster.copy()
        for work in leaving:
            give_parts(scratch, work.request, work.parts)
        return choose_gang(scratch, request) is not None
    by_node: dict[int, NodeRow] = {}
    for work in leaving:
        for node, _ in work.parts:
            by_node.setdefault(node, NodeRow(cluster, node)).give(work)
    pinned = cluster.node_index.get(request.pinned_node) if request.pinned_node is not None else None
    return any(row.fits(request) for node, row in by_node.items() if pinned is None or node == pinned)
