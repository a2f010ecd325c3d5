"""Gangs across nodes, reservation and backfill, and elastic work, on plain objects (no database)."""

import numpy as np
import pytest

from scheduler.policy import (
    CardSpec,
    ClusterState,
    MlfqConfig,
    NodeSpec,
    Part,
    Place,
    Request,
    Work,
    choose_parts,
    decide,
    is_gang,
)
from scheduler.policy.decide import DISCIPLINES
from scheduler.policy.placement import fits_after

CONFIG = MlfqConfig(thresholds=(100.0, 1000.0), starvation_s=10**6, reserve_after_s=600.0, resize_interval_s=300.0)


def node(node_id, free=8, cards=8, *, group=None, cpu=64, memory=262144):
    """A node of ``cards`` A100s of which the first ``free`` are free."""
    specs = [CardSpec(f"{node_id}/{i}", "A100", 81920, 1000 if i < free else 0, None) for i in range(cards)]
    return NodeSpec(node_id, cpu, memory, specs, group=group)


def work(work_id, gpus=1, *, user="u", submitted=0.0, cpu=0, nodes=None, **fields):
    request = Request(work_id, "A100", gpus, cpu=cpu, nodes=nodes)
    return Work(work_id, user, request, submitted=submitted, waiting_since=submitted, **fields)


def running(work_id, parts, *, attained=0.0, preemptible=True, **fields):
    """Running work holding ``parts`` [(node, [cards])], rank 0 first; the cluster must show them taken."""
    gpus = sum(len(cards) for _, cards in parts)
    w = work(work_id, gpus, attained=attained, preemptible=preemptible, **fields)
    w.node, w.cards = parts[0]
    w.rest = list(parts[1:])
    return w


def cards_of(place: Place) -> list[tuple[int, list[int]]]:
    return [(p.node, p.cards) for p in place.parts]


# --- the interface ---------------------------------------------------------------------------------------------


def test_nodes_must_split_the_cards_evenly_and_take_whole_cards():
    with pytest.raises(ValueError, match="Request.nodes"):
        Request(1, "A100", 12, nodes=5)
    with pytest.raises(ValueError, match="Request.nodes"):
        Request(1, "A100", 2, 500, nodes=2)
    with pytest.raises(ValueError, match="Request.nodes"):
        Request(1, "A100", 2, nodes=0)


def test_a_place_is_rank_zeros_part_and_the_rest():
    place = Place(7, 0, [0, 1], [80, 80], [Part(2, [3], [80])])
    assert [(p.node, p.cards) for p in place.parts] == [(0, [0, 1]), (2, [3])]
    assert place.gpu_count == 3
    assert Place(8, 1, [0], [80]).rest == []


def test_work_wider_than_any_node_is_a_gang_and_work_that_fits_one_node_is_not():
    c = ClusterState([node("a"), node("b")])
    assert is_gang(c, Request(1, "A100", 16))
    assert not is_gang(c, Request(2, "A100", 8))
    assert is_gang(c, Request(3, "A100", 8, nodes=2))
    # Four cards with only two free per node: it waits for one node rather than spreading by itself.
    c = ClusterState([node("a", free=2), node("b", free=2)])
    assert choose_parts(c, Request(4, "A100", 4), "bestfit") is None
    assert len(choose_parts(c, Request(5, "A100", 4, nodes=2), "bestfit")) == 2


# --- placement -------------------------------------------------------------------------------------------------


def test_a_gang_takes_whole_nodes_first_and_the_best_fitting_partial_node_last():
    c = ClusterState([node("a", free=6), node("b"), node("c", free=4), node("d")])
    parts = choose_parts(c, Request(1, "A100", 20), "bestfit")
    assert [(p.node, len(p.cards)) for p in parts] == [(1, 8), (3, 8), (2, 4)]


def test_the_fewest_nodes_win_over_whole_nodes():
    c = ClusterState([node("a", free=7), node("b", free=7), node("c", free=7)])
    parts = choose_parts(c, Request(1, "A100", 14), "bestfit")
    assert sorted(len(p.cards) for p in parts) == [7, 7]


def test_a_fixed_node_count_splits_evenly_onto_the_best_fits():
    c = ClusterState([node("a"), node("b", free=4), node("c", free=5), node("d", free=4)])
    parts = choose_parts(c, Request(1, "A100", 8, nodes=2), "bestfit")
    assert [(p.node, len(p.cards)) for p in parts] == [(1, 4), (3, 4)]


def test_a_gang_keeps_to_one_rack_when_one_can_hold_it():
    c = ClusterState(
        [node("a1", group="a"), node("b1", group="b"), node("a2", free=2, group="a"), node("b2", group="b")]
    )
    parts = choose_parts(c, Request(1, "A100", 16), "bestfit")
    assert sorted(p.node for p in parts) == [1, 3]
    # No rack holds 24 cards: it spans racks rather than waiting.
    c = ClusterState(
        [node("a1", group="a"), node("b1", group="b"), node("a2", group="a"), node("b2", free=0, group="b")]
    )
    assert len(choose_parts(c, Request(2, "A100", 24), "bestfit")) == 3


def test_each_member_needs_its_own_cpu_and_memory():
    c = ClusterState([node("a", cpu=4), node("b", cpu=16), node("c", cpu=16)])
    parts = choose_parts(c, Request(1, "A100", 16, cpu=8), "bestfit")
    assert sorted(p.node for p in parts) == [1, 2]
    assert choose_parts(c, Request(2, "A100", 24, cpu=8), "bestfit") is None


def test_decide_places_a_gang_whole_and_takes_every_members_capacity():
    c = ClusterState([node("a", cpu=16), node("b", cpu=16), node("c", free=4, cpu=16)])
    d = decide([work(1, 16, cpu=4)], [], c, now=0, strategy="bestfit")
    (place,) = d.place
    assert sorted(len(p.cards) for p in place.parts) == [8, 8]
    assert {p.node for p in place.parts} == {0, 1}
    assert place.memory_mb == [81920] * 8 and len(place.rest) == 1
    assert c.free[:2].sum() == 0 and list(c.cpu_free) == [12, 12, 16]


def test_a_gang_that_does_not_fit_holds_nothing_and_says_why():
    c = ClusterState([node("a"), node("b", free=4)])
    before = c.free.copy()
    d = decide([work(1, 16)], [], c, now=0, strategy="bestfit")
    assert d.place == [] and (c.free == before).all()
    assert "not enough free A100 cards across nodes for this 16-card job" in d.waiting[1].reason


# --- giving capacity back --------------------------------------------------------------------------------------


def test_a_leaving_gang_gives_back_every_part():
    c = ClusterState([node("a", free=0), node("b", free=0)])
    gang = running(9, [(0, list(range(8))), (1, list(range(8)))])
    assert fits_after(c, Request(1, "A100", 8), [gang])
    assert fits_after(c, Request(2, "A100", 16), [gang])


def test_a_gang_evicts_lower_queue_work_on_several_nodes_all_at_once():
    c = ClusterState([node("a", free=4), node("b", free=4), node("c", free=0)])
    low = [running(10, [(0, [4, 5, 6, 7])], attained=5000), running(11, [(1, [4, 5, 6, 7])], attained=5000)]
    top = running(12, [(2, list(range(8)))], attained=0)  # queue 0: the gang may not evict it
    d = decide([work(1, 16)], [*low, top], c, now=0, discipline=DISCIPLINES["mlfq"](CONFIG), strategy="bestfit")
    assert sorted(p.work_id for p in d.preempt) == [10, 11]
    assert d.waiting[1].reason.startswith("waiting: preempting 2 lower-priority runs")


def test_a_gang_evicts_nothing_if_evicting_cannot_make_it_fit():
    c = ClusterState([node("a", free=4), node("b", free=0)])
    low = running(10, [(0, [4, 5, 6, 7])], attained=5000)
    top = running(12, [(1, list(range(8)))], attained=0)
    d = decide([work(1, 16)], [low, top], c, now=0, discipline=DISCIPLINES["mlfq"](CONFIG), strategy="bestfit")
    assert d.preempt == []


def test_evicting_a_gang_for_single_node_work_stops_the_whole_gang():
    c = ClusterState([node("a", free=0), node("b", free=0)])
    gang = running(9, [(0, list(range(8))), (1, list(range(8)))], attained=5000)
    d = decide([work(1, 8)], [gang], c, now=0, discipline=DISCIPLINES["mlfq"](CONFIG), strategy="bestfit")
    assert [p.work_id for p in d.preempt] == [9]
    # Next tick the gang is still stopping: the waiter waits for it, and nothing is evicted twice.
    d = decide([work(1, 8)], [gang], c, now=1, discipline=DISCIPLINES["mlfq"](CONFIG), strategy="bestfit")
    assert d.preempt == [] and "waiting for preempted work to stop" in d.waiting[1].reason


# --- reservation and backfill ----------------------------------------------------------------------------------


def busy_cluster():
    """Three nodes with 6 of 8 cards held by work that may not be evicted (instances)."""
    c = ClusterState([node("a", free=2), node("b", free=2), node("c", free=2)])
    held = [running(100 + n, [(n, [2, 3, 4, 5, 6, 7])], preemptible=False) for n in range(3)]
    return c, held


def test_a_gang_that_waited_long_enough_reserves_nodes_and_smaller_work_backfills_elsewhere():
    c, held = busy_cluster()
    gang = work(1, 16, submitted=0)
    small = [work(2, 2, submitted=10), work(3, 2, submitted=20)]
    d = decide([gang, *small], held, c, now=1000, discipline=DISCIPLINES["mlfq"](CONFIG), strategy="bestfit")
    assert d.waiting[1].reason.startswith("waiting: reserved 2 nodes (a, b) for this 16-card job")
    assert set(d.reserved) == {1}
    assert [(p.work_id, p.node) for p in d.place] == [(2, 2)]
    assert "outside reserved nodes" in d.waiting[3].reason


def test_no_reservation_before_the_bound():
    c, held = busy_cluster()
    d = decide([work(1, 16), work(2, 2, submitted=10)], held, c, now=100, discipline=DISCIPLINES["mlfq"](CONFIG))
    assert d.reserved == {} and [p.work_id for p in d.place] == [2]


def test_work_known_to_end_before_the_reservation_starts_backfills_onto_it():
    c, held = busy_cluster()
    for h, left in zip(held, (500, 600, 5000), strict=True):
        h.remaining = left
    gang = work(1, 16, remaining=10)  # first in SRTF order
    short, long = work(2, 2, submitted=10, remaining=400), work(3, 2, submitted=20, remaining=4000)
    d = decide([gang, short, long], held, c, now=1000, discipline=DISCIPLINES["srtf"](CONFIG), strategy="bestfit")
    assert "reserved 2 nodes (a, b)" in d.reserved[1] and "free in about 600 s" in d.reserved[1]
    placed = {p.work_id: p.node for p in d.place}
    assert placed[2] in (0, 1) and placed[3] == 2


def test_reserved_nodes_drain_and_the_gang_starts_there():
    c, held = busy_cluster()
    discipline = DISCIPLINES["mlfq"](CONFIG)
    decide([work(1, 16)], held, c, now=1000, discipline=discipline, strategy="bestfit")
    for h in held[:2]:  # the work on the reserved nodes ends
        c.give(h.node, h.cards, 1000, 0, 0)
    d = decide([work(1, 16), work(2, 8, submitted=5)], held[2:], c, now=2000, discipline=discipline)
    assert [p.work_id for p in d.place] == [1]


def test_fifo_makes_no_reservation_its_head_blocks_everything():
    c, held = busy_cluster()
    d = decide([work(1, 16), work(2, 2, submitted=10)], held, c, now=5000, discipline=DISCIPLINES["fifo"](CONFIG))
    assert d.place == [] and d.reserved == {}


# --- elastic ---------------------------------------------------------------------------------------------------


def test_elastic_work_starts_at_its_minimum_when_its_size_does_not_fit():
    c = ClusterState([node("a", free=4)])
    d = decide([work(1, 8, elastic_min=4, elastic_max=8)], [], c, now=0, strategy="bestfit")
    assert d.place[0].gpu_count == 4 and d.resize == []


def test_elastic_work_placed_while_nothing_else_waits_starts_as_large_as_fits():
    c = ClusterState([node("a", free=6)])
    d = decide([work(1, 4, elastic_min=2, elastic_max=8)], [], c, now=0, strategy="bestfit")
    assert d.place[0].gpu_count == 6


def test_running_elastic_work_grows_into_idle_cards_when_nothing_waits():
    c = ClusterState([node("a", free=4)])
    w = running(1, [(0, [4, 5, 6, 7])], elastic_min=2, elastic_max=8, resized_at=0)
    d = decide([], [w], c, now=1000, discipline=DISCIPLINES["mlfq"](CONFIG), strategy="bestfit")
    (resize,) = d.resize
    assert resize.gpu_count == 8 and resize.reason == "grown from 4 to 8 cards into idle capacity"
    assert w.request.gpu_count == 8 and c.free.sum() == 0 and w.resized_at == 1000


def test_elastic_work_shrinks_by_half_for_queued_work_and_never_below_its_minimum():
    c = ClusterState([node("a", free=0)])
    w = running(1, [(0, list(range(8)))], attained=5000, elastic_min=4, elastic_max=8, resized_at=0, preemptible=False)
    d = decide([work(2, 2)], [w], c, now=1000, discipline=DISCIPLINES["mlfq"](CONFIG), strategy="bestfit")
    assert [(r.work_id, r.gpu_count) for r in d.resize] == [(1, 4)]  # half: one restart for the next jobs too
    assert d.resize[0].reason == "shrunk from 8 to 4 cards for queued work 2"
    assert [p.work_id for p in d.place] == [2]
    d = decide([work(3, 4)], [w], c, now=2000, discipline=DISCIPLINES["mlfq"](CONFIG), strategy="bestfit")
    assert [(r.work_id, r.gpu_count) for r in d.resize] == [] and 3 in d.waiting  # at its minimum already


def test_elastic_work_grows_again_only_after_the_interval_but_shrinks_at_once():
    c = ClusterState([node("a", free=4)])
    w = running(1, [(0, [0, 1, 2, 3])], attained=5000, elastic_min=2, elastic_max=8, resized_at=900)
    d = decide([], [w], c, now=1000, discipline=DISCIPLINES["mlfq"](CONFIG), strategy="bestfit")
    assert d.resize == []  # grown or started 100 s ago: no grow yet
    c = ClusterState([node("a", free=0)])
    w = running(1, [(0, list(range(8)))], attained=5000, elastic_min=2, elastic_max=8, resized_at=900)
    d = decide([work(2, 2)], [w], c, now=1000, discipline=DISCIPLINES["mlfq"](CONFIG), strategy="bestfit")
    assert [(r.work_id, r.gpu_count) for r in d.resize] == [(1, 4)] and [p.work_id for p in d.place] == [2]


def test_rigid_victims_go_before_elastic_ones_on_a_node():
    c = ClusterState([node("a", free=0)])
    rigid = running(1, [(0, [0, 1, 2, 3])], attained=5000, started=10)
    flexible = running(2, [(0, [4, 5, 6, 7])], attained=5000, elastic_min=4, elastic_max=8, started=20)
    d = decide([work(3, 4)], [rigid, flexible], c, now=1000, discipline=DISCIPLINES["mlfq"](CONFIG), strategy="bestfit")
    assert [p.work_id for p in d.preempt] == [1]  # the later-started elastic one would lose less, yet stays


def test_elastic_work_gives_its_cards_above_its_minimum_to_any_queued_work_but_spot_work_from_on_demand():
    c = ClusterState([node("a", free=0)])
    w = running(1, [(0, list(range(8)))], attained=10, elastic_min=2, elastic_max=8, preemptible=False)
    d = decide([work(2, 2)], [w], c, now=1000, discipline=DISCIPLINES["mlfq"](CONFIG), strategy="bestfit")
    assert [(r.work_id, r.gpu_count) for r in d.resize] == [(1, 4)] and [p.work_id for p in d.place] == [2]
    c = ClusterState([node("a", free=0)])
    w = running(1, [(0, list(range(8)))], attained=10, elastic_min=2, elastic_max=8, preemptible=False)
    d = decide([work(3, 2, spot=True)], [w], c, now=1000, discipline=DISCIPLINES["mlfq"](CONFIG), strategy="bestfit")
    assert d.resize == [] and d.place == []


def test_random_gangs_never_over_allocate_and_always_place_whole():
    rng = np.random.default_rng(1)
    for trial in range(40):
        nodes = [node(f"n{i}", free=int(rng.integers(0, 9)), group=int(rng.integers(0, 2))) for i in range(5)]
        c = ClusterState(nodes)
        count = int(rng.integers(9, 33))
        parts = choose_parts(c, Request(trial, "A100", count), "bestfit")
        free = np.where(c.exists, c.free, 0).sum() // 1000
        if parts is None:
            assert free < count  # the fewest-nodes plan exists whenever enough cards are free
            continue
        assert sum(len(p.cards) for p in parts) == count
        assert len({p.node for p in parts}) == len(parts)
        for p in parts:
            assert (c.free[p.node, p.cards] == 1000).all()
