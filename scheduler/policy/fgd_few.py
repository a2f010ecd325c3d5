"""FGD's best score on each of a few nodes, in plain Python: what ``placement._rescore`` does for the handful of
nodes that a placement or a departure changed since a request shape was last scored.

The array path costs ~0.2 ms a rescoring whatever the number of nodes (some forty numpy calls at a few
microseconds each); the live tick rescores one to a few nodes ~200 times a tick. Here the same arithmetic runs
over plain lists. Both are exact: the mix's weights are counts, so a node state's fragmentation is an integer
(thousandths of a card times counts) and a score is the difference of two, divided once by the mix's total and
rounded as ``placement._exact`` rounds — the two paths give every node the same score, tie-break and card to the
bit (``tests/scheduler/test_fgd_few.py``), so which one ran never changes a decision.
"""

from __future__ import annotations

from typing import NamedTuple

from scheduler.policy.cluster import NO_CLASS, WHOLE_CARD, ClusterState

FEW_NODES = 12  # up to this many stale nodes are scored here, more over the arrays (about even at 12-16 nodes)


class MixRows(NamedTuple):
    """A mix whose weights are whole counts, as plain values."""

    sizes: tuple[int, ...]  # the share sizes its fractions ask for (``_MixArrays.sizes``)
    # Per task type: (weight, uses a card, is a fraction, index of its size, cards, CPU, memory).
    types: tuple[tuple[int, bool, bool, int, int, int, int], ...]
    total: int  # the weights' sum


def rescore(cluster: ClusterState, request, mix: MixRows, stale, delta, tiebreak, card) -> None:
    """Write the best score of each ``stale`` node row into ``delta`` (+inf where the request cannot go),
    ``tiebreak`` and, for a fraction, ``card``, as ``placement._rescore`` does."""
    rows = stale.tolist()
    delta[stale] = float("inf")
    rule = cluster.one_size_per_card
    fraction = 0 < request.gpu_milli < WHOLE_CARD
    milli = request.gpu_milli
    model = None if request.gpu_model is None else cluster.model_code(request.gpu_model)
    cpu, mem, disk = (
        cluster.cpu_free[stale].tolist(),
        cluster.mem_free[stale].tolist(),
        cluster.disk_free[stale].tolist(),
    )
    exists, models = cluster.exists[stale].tolist(), cluster.model[stale].tolist()
    frees, classes = cluster.free[stale].tolist(), cluster.card_class[stale].tolist()
    mem_total, mem_free = cluster.card_mem_total[stale].tolist(), cluster.card_mem_free[stale].tolist()
    for i, row in enumerate(rows):
        if cpu[i] < request.cpu or mem[i] < request.memory_mb or disk[i] < request.disk_gb:
            continue
        cards = [
            (column, frees[i][column], classes[i][column] if rule else NO_CLASS)
            for column, present in enumerate(exists[i])
            if present and (model is None or models[i][column] == model)
        ]
        eligible = [
            (column, free, share_class)
            for column, free, share_class in cards
            if free >= milli
            and mem_free[i][column] >= mem_total[i][column] * milli // WHOLE_CARD
            and (not fraction or not rule or share_class in (NO_CLASS, milli))
        ]
        if len(eligible) < (1 if fraction else request.gpu_count):
            continue  # no card (or not enough) for it: +inf, as set above
        before = (*_stats(mix, cards, rule), cpu[i], mem[i])
        if fraction:
            delta[row], tiebreak[row], card[row] = _best_card(mix, request, before, eligible, rule)
        else:
            delta[row] = _growth(mix, before, _whole_after(mix, request, before))
            tiebreak[row] = len(eligible) - request.gpu_count


def _joins(free: int, share_class: int, size: int, rule: bool) -> bool:
    """Whether a fraction of ``size`` could join a card with this free share and class (``placement._card_terms``)."""
    return free >= size and (not rule or share_class == NO_CLASS or share_class == size)


def _stats(mix: MixRows, cards: list, rule: bool) -> tuple[int, list[int], int, list[int]]:
    """(total free share, fragsum per size, whole free cards, usable per size) of a node's cards, as
    ``placement._node_stats_sub`` gives them."""
    total = whole = 0
    lost, fits = [0] * len(mix.sizes), [0] * len(mix.sizes)
    for _, free, share_class in cards:
        total += free
        whole += free == WHOLE_CARD
        for s, size in enumerate(mix.sizes):
            if _joins(free, share_class, size, rule):
                fits[s] += 1
            else:
                lost[s] += free
    return total, lost, whole, fits


def _fragmentation(mix: MixRows, state: tuple) -> int:
    """The node state's expected fragmentation times the mix's total (``placement._fragmentation``)."""
    total, lost, whole, fits, cpu, mem = state
    frag = 0
    for weight, uses_card, fraction, s, count, type_cpu, type_mem in mix.types:
        usable = uses_card and cpu >= type_cpu and mem >= type_mem and (fits[s] > 0 if fraction else whole >= count)
        frag += weight * ((lost[s] if fraction else total - WHOLE_CARD * whole) if usable else total)
    return frag


def _growth(mix: MixRows, before: tuple, after: tuple) -> float:
    """``placement._growth`` of one state: the difference over the total, rounded as ``np.round(x, 6)`` (times
    10^6, to the nearest even, divided)."""
    return round((_fragmentation(mix, after) - _fragmentation(mix, before)) / mix.total * 1e6) / 1e6


def _whole_after(mix: MixRows, request, before: tuple) -> tuple:
    total, lost, whole, fits, cpu, mem = before
    count = request.gpu_count
    # Each card taken was whole and of no class: usable by every share size, left with nothing.
    return (
        total - WHOLE_CARD * count,
        lost,
        whole - count,
        [usable - count * (WHOLE_CARD >= size) for usable, size in zip(fits, mix.sizes, strict=True)],
        cpu - request.cpu,
        mem - request.memory_mb,
    )


def _best_card(mix: MixRows, request, before: tuple, eligible: list, rule: bool) -> tuple:
    """(score, share left over, column) of the node's best card (``eligible``: one at least) for a fraction: the
    least score, then the least left over, then the lowest column (``placement._rescore``'s order)."""
    total, lost, whole, fits, cpu, mem = before
    milli = request.gpu_milli
    best = None
    for column, free, share_class in eligible:
        left = free - milli
        lost_after, fits_after = list(lost), list(fits)
        for s, size in enumerate(mix.sizes):
            fit_before = _joins(free, share_class, size, rule)
            fit_after = _joins(left, milli, size, rule)  # the card's class is now the request's
            lost_after[s] += (0 if fit_after else left) - (0 if fit_before else free)
            fits_after[s] += fit_after - fit_before
        after = (
            total - milli,
            lost_after,
            whole - (free == WHOLE_CARD),
            fits_after,
            cpu - request.cpu,
            mem - request.memory_mb,
        )
        candidate = (_growth(mix, before, after), left, column)
        if best is None or candidate < best:
            best = candidate
    return best
