"""The scheduling policy on plain objects (no database): placement, MLFQ, fair share, preemption."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.policy import (
    HIGH,
    LOW,
    CardSpec,
    ClusterState,
    MlfqConfig,
    NodeSpec,
    Quotas,
    Request,
    TaskType,
    Work,
    accrue,
    choose,
    decide,
    level_of,
)
from scheduler.policy.decide import DISCIPLINES
from scheduler.policy.mlfq import service_rate


def node(node_id, *frees, model="A100", cpu=64, memory=262144, card_memory=81920):
    cards = [
        CardSpec(f"{node_id}/{i}", model, card_memory, free, card_memory * free // 1000) for i, free in enumerate(frees)
    ]
    return NodeSpec(node_id, cpu, memory, cards)


def cluster(*nodes):
    return ClusterState(list(nodes))


def work(work_id, *, gpus=1, milli=1000, user="u", submitted=0.0, **fields):
    return Work(
        work_id, user, Request(work_id, "A100", gpus, milli), submitted=submitted, waiting_since=submitted, **fields
    )


# --- placement -------------------------------------------------------------------------------------------------


def test_it_only_places_on_the_requested_model():
    c = cluster(node("n1", 1000, model="V100"), node("n2", 1000))
    assert choose(c, Request(1, "A100"), "bestfit").node == 1
    assert choose(c, Request(2, "H100"), "bestfit") is None


def test_best_fit_packs_a_fraction_onto_the_fullest_card_that_fits():
    c = cluster(node("n1", 1000, 500, 100))
    assert choose(c, Request(1, "A100", 1, 300), "bestfit").cards == [1]


def test_fgd_keeps_whole_cards_whole_for_the_expected_mix():
    c = cluster(node("n1", 1000, 1000), node("n2", 600, 0))
    mix = [TaskType(1, 1000, 0, 0, 1.0), TaskType(1, 500, 0, 0, 1.0)]
    assert choose(c, Request(1, "A100", 1, 500), "fgd", mix=mix).node == 1


def test_fgd_scores_shared_by_a_state_and_its_copies_are_never_taken_for_another_capacity():
    mix = [TaskType(1, 1000, 0, 0, 1.0), TaskType(2, 1000, 0, 0, 1.0)]
    base = cluster(node("n1", 1000, 1000, 1000, 1000), node("n2", 1000, 1000, 0, 0))
    copy = base.copy()
    copy.score_cache = base.score_cache  # as the tick's state kept across ticks shares its scores with its copies
    copy.take(0, [0, 1, 2, 3], 1000, 0, 0)
    assert choose(copy, Request(1, "A100"), "fgd", mix=mix).node == 1  # n1 scored full in the copy
    base.take(0, [0], 1000, 0, 0)  # n1 with three cards left here: as often changed, another capacity
    fresh = cluster(node("n1", 0, 1000, 1000, 1000), node("n2", 1000, 1000, 0, 0))
    assert choose(fresh, Request(2, "A100"), "fgd", mix=mix).node == 0  # two cards stay together on n2
    assert choose(base, Request(2, "A100"), "fgd", mix=mix).node == 0


def test_fgd_gives_near_equal_candidates_to_best_fit():
    # Both nodes absorb the fraction into a partial card; n2 would leave 0.1 that the rare 0.15 type cannot
    # use, a growth of under 0.01 card in expectation, so the tighter fit wins instead of the exact minimum.
    c = cluster(node("n1", 500, 0), node("n2", 400, 0))
    mix = [TaskType(1, 1000, 0, 0, 20.0), TaskType(1, 150, 0, 0, 1.0)]
    assert choose(c, Request(1, "A100", 1, 300), "fgd", mix=mix).node == 1


def test_a_fraction_gets_gpu_memory_in_proportion():
    c = cluster(node("n1", 1000, card_memory=80000))
    choice = choose(c, Request(1, "A100", 1, 250), "bestfit")
    assert c.take(choice.node, choice.cards, 250, 0, 0) == [20000]


def test_multi_card_work_is_all_or_nothing_on_one_node():
    c = cluster(node("n1", 1000, 1000), node("n2", 1000, 500))
    assert choose(c, Request(1, "A100", 3), "bestfit") is None
    assert choose(c, Request(2, "A100", 2), "bestfit").node == 0


def test_whole_cards_go_where_they_leave_the_fewest_free_cards():
    c = cluster(node("big", *[1000] * 8), node("small", 1000, 1000))
    assert choose(c, Request(1, "A100"), "bestfit").node == 1


def test_cpu_and_host_memory_are_checked_with_the_cards():
    c = cluster(node("n1", 1000, cpu=4, memory=8192))
    assert choose(c, Request(1, "A100", cpu=8), "bestfit") is None
    assert choose(c, Request(2, "A100", memory_mb=16384), "bestfit") is None
    assert choose(c, Request(3, "A100", cpu=4, memory_mb=8192), "bestfit") is not None


def test_pinned_work_only_goes_back_to_its_node():
    c = cluster(node("n1", 0), node("n2", 1000))
    assert choose(c, Request(1, "A100", pinned_node="n1"), "bestfit") is None
    assert choose(c, Request(2, "A100", pinned_node="n2"), "bestfit").node == 1


def test_fgd_keeps_to_the_pinned_node_and_the_allowed_ones_and_to_room_taken_since_it_scored():
    mix = [TaskType(1, 1000, 0, 0, 1.0), TaskType(1, 500, 0, 0, 1.0)]
    c = cluster(node("n1", 1000, 1000), node("n2", 600, 0), node("n3", 1000, 1000, cpu=8))
    assert choose(c, Request(1, "A100", 1, 500), "fgd", mix=mix).node == 1  # FGD's own pick, scored for the shape
    assert choose(c, Request(1, "A100", 1, 500, pinned_node="n1"), "fgd", mix=mix).node == 0
    assert choose(c, Request(1, "A100", 1, 500, pinned_node="gone"), "fgd", mix=mix) is None
    assert choose(c, Request(1, "A100", 1, 500), "fgd", mix=mix, allowed=np.array([1, 0, 1], bool)).node == 0
    only_n3 = np.array([0, 0, 1], bool)
    assert choose(c, Request(1, "A100", 1, 500, cpu=4), "fgd", mix=mix, allowed=only_n3).node == 2
    c.take(2, [], 0, 8, 0)  # n3's cores taken since the shape was scored with them free
    assert choose(c, Request(1, "A100", 1, 500, cpu=4), "fgd", mix=mix, allowed=only_n3) is None
    assert choose(c, Request(1, "A100", 1, 500, cpu=4, pinned_node="n3"), "fgd", mix=mix) is None
    assert choose(c, Request(1, "A100", 1, 500, pinned_node="n3"), "fgd", mix=mix).node == 2  # no cores asked


@settings(max_examples=60, deadline=None)
@given(
    frees=st.lists(st.lists(st.integers(0, 1000), min_size=1, max_size=4), min_size=1, max_size=4),
    requests=st.lists(
        st.tuples(
            st.integers(1, 3),
            st.integers(1, 1000),
            st.sampled_from(["fgd", "bestfit", "random", "firstfit"]),
            st.sampled_from([None, "A100"]),
        ),
        max_size=25,
    ),
)
def test_no_sequence_of_decisions_over_allocates_a_card_or_misses_room(frees, requests):
    c = cluster(*[node(f"n{i}", *f) for i, f in enumerate(frees)])
    mix = [TaskType(1, 500, 0, 0, 1), TaskType(2, 1000, 0, 0, 1)]
    rng = np.random.default_rng(0)
    sizes = {}  # (node, card) -> share sizes placed on it here: one per card
    for i, (count, milli, strategy, model) in enumerate(requests):
        request = Request(i, model, count if milli == 1000 else 1, milli)
        before = {name: getattr(c, name).copy() for name in ("exists", "free", "card_mem_free", "cpu_free", "mem_free")}
        choice = choose(c, request, strategy, mix=mix, rng=rng)
        for name, array in before.items():
            assert (getattr(c, name) == array).all(), f"choose() changed cluster.{name}"
        if choice is None:  # every strategy finds room whenever any does
            assert choose(c, request, "firstfit") is None
        else:
            assert len(set(choice.cards)) == request.gpu_count
            c.take(choice.node, choice.cards, request.gpu_milli, 0, 0)
            if milli < 1000:
                sizes.setdefault((choice.node, choice.cards[0]), set()).add(milli)
        assert (c.free >= 0).all() and (c.card_mem_free >= 0).all()
        assert all(len(placed) == 1 for placed in sizes.values())


# --- MLFQ ------------------------------------------------------------------------------------------------------

CONFIG = MlfqConfig(thresholds=(100.0, 1000.0), idle_util=0.3, idle_weight=0.25, starvation_s=500.0)


def test_new_work_enters_the_top_queue_and_sinks_with_gpu_seconds():
    w = work(1, gpus=2)
    assert level_of(w, 0, CONFIG, waiting=False) == 0
    accrue(w, 60, 0.9, CONFIG)  # 2 cards x 60 s = 120 GPU-seconds
    assert w.attained == 120 and level_of(w, 60, CONFIG, waiting=False) == 1


def test_idle_work_accrues_service_more_slowly_and_stays_higher():
    busy, idle = work(1), work(2)
    accrue(busy, 200, 0.95, CONFIG)
    accrue(idle, 200, 0.05, CONFIG)
    assert idle.attained == busy.attained * 0.25
    assert level_of(idle, 0, CONFIG, waiting=False) < level_of(busy, 0, CONFIG, waiting=False)


def test_work_without_a_reading_accrues_as_fully_busy_never_at_the_idle_rate():
    # A fraction of a card under MPS has no per-tenant compute reading (None): no evidence of idleness.
    unread, busy = work(1), work(2)
    accrue(unread, 200, None, CONFIG)
    accrue(busy, 200, 1.0, CONFIG)
    assert unread.attained == busy.attained == 200
    assert service_rate(None, idle_util=0.3, idle_weight=0.25) == 1.0
    assert service_rate(0.0, idle_util=0.3, idle_weight=0.25) == 0.25, "only a reading earns the discount"


def test_work_that_waited_past_the_starvation_limit_is_promoted_to_the_top():
    w = work(1, attained=5000.0, submitted=0.0)
    assert level_of(w, 100, CONFIG, waiting=True) == 2
    assert level_of(w, 600, CONFIG, waiting=True) == 0


def test_higher_queues_go_first_then_fair_share_then_priority_then_arrival():
    c = cluster(node("n1", 1000))
    heavy = work("heavy", user="bob", submitted=0, attained=5000.0)
    low_pri = work("low", user="carol", submitted=1, priority=LOW)
    high_pri = work("high", user="carol", submitted=2, priority=HIGH)
    d = decide([heavy, low_pri, high_pri], [], c, now=3, discipline=DISCIPLINES["mlfq"](CONFIG), strategy="bestfit")
    assert [p.work_id for p in d.place] == ["high"]
    assert d.waiting["low"].position == 1 and d.waiting["heavy"].level == 2
    assert "position 1 in queue 0" in d.waiting["low"].reason


def test_a_user_under_their_fair_share_goes_before_one_over_it():
    c = cluster(node("n1", 0, 0, 0, 1000))  # 4 cards, one free; alice already holds 3
    running = [work(f"a{i}", user="alice") for i in range(3)]
    for i, r in enumerate(running):
        r.node, r.cards = 0, [i]
    first = work("alice-more", user="alice", submitted=0)
    later = work("bob", user="bob", submitted=5)
    d = decide([first, later], running, c, now=6, discipline=DISCIPLINES["mlfq"](CONFIG), strategy="bestfit")
    assert [p.work_id for p in d.place] == ["bob"]


def test_a_team_over_its_fair_share_goes_after_one_under_it():
    # Two teams share 4 cards; team a already holds 3 (its share is 2). a3 is new and holds nothing itself,
    # but comes after team b's later work.
    c = cluster(node("n1", 0, 0, 0, 1000))
    running = [work(f"a{i}", user=f"a{i}", team="a") for i in range(3)]
    for i, r in enumerate(running):
        r.node, r.cards = 0, [i]
    first = work("a3", user="a3", team="a", submitted=0)
    later = work("b1", user="b1", team="b", submitted=5)
    d = decide([first, later], running, c, now=6, discipline=DISCIPLINES["mlfq"](CONFIG), strategy="bestfit")
    assert [p.work_id for p in d.place] == ["b1"]


def test_quotas_hold_work_back_with_a_reason():
    c = cluster(node("n1", 1000, 1000, 1000))
    d = decide(
        [work(1, gpus=2, user="u"), work(2, user="u", submitted=1)],
        [],
        c,
        now=2,
        quotas=Quotas(per_user={"u": 2}),
        strategy="bestfit",
    )
    assert [p.work_id for p in d.place] == [1]
    assert "user quota of 2 cards" in d.waiting[2].reason


def test_an_unplaceable_request_says_what_it_waits_for_and_where_it_stands():
    c = cluster(node("n1", 0))
    d = decide([work(1, milli=500), work(2, submitted=1)], [], c, now=2, strategy="bestfit")
    assert d.waiting[1].reason == "waiting: no A100 card has 0.5 free; position 1 in queue 0"
    assert d.waiting[2].position == 2


# --- preemption ------------------------------------------------------------------------------------------------


def running(work_id, node=0, cards=(0,), **fields):
    w = work(work_id, **fields)
    w.node, w.cards = node, list(cards)
    return w


def test_on_demand_instances_are_never_preempted():
    c = cluster(node("n1", 0))
    victim = running("on-demand", preemptible=False, attained=1e9)
    d = decide([work("new", submitted=1)], [victim], c, now=2, discipline=DISCIPLINES["mlfq"](CONFIG))
    assert d.preempt == [] and "no free A100 card" in d.waiting["new"].reason


def test_on_demand_work_evicts_spot_capacity_whatever_the_queues():
    c = cluster(node("n1", 0))
    spot = running("spot", preemptible=True, spot=True)
    d = decide([work("od", attained=5000.0, submitted=1)], [spot], c, now=2, discipline=DISCIPLINES["mlfq"](CONFIG))
    assert [p.work_id for p in d.preempt] == ["spot"]
    assert "preempting 1 lower-priority run" in d.waiting["od"].reason


def test_a_batch_job_is_preempted_only_by_work_in_a_higher_queue():
    c = cluster(node("n1", 0))
    same_level = running("job", preemptible=True)
    d = decide([work("new", submitted=1)], [same_level], c, now=2, discipline=DISCIPLINES["mlfq"](CONFIG))
    assert d.preempt == []
    sunk = running("long-job", preemptible=True, attained=5000.0)
    d = decide([work("new", submitted=1)], [sunk], c, now=2, discipline=DISCIPLINES["mlfq"](CONFIG))
    assert [p.work_id for p in d.preempt] == ["long-job"]


def test_it_picks_the_fewest_and_lowest_priority_victims():
    c = cluster(node("n1", 0, 0), node("n2", 0, 0))
    victims = [
        running("n1-a", node=0, cards=[0], preemptible=True, attained=200.0),
        running("n1-b", node=0, cards=[1], preemptible=True, attained=200.0),
        running("n2-wide", node=1, cards=[0, 1], gpus=2, preemptible=True, attained=5000.0),
    ]
    d = decide([work("new", gpus=2, submitted=1)], victims, c, now=2, discipline=DISCIPLINES["mlfq"](CONFIG))
    assert [p.work_id for p in d.preempt] == ["n2-wide"]


def test_work_already_being_evicted_is_waited_for_not_doubled():
    c = cluster(node("n1", 0))
    leaving = running("leaving", preemptible=True, attained=5000.0, stopping=True)
    other = running("other", node=0, cards=[0], preemptible=True, attained=5000.0)
    d = decide([work("new", submitted=1)], [leaving, other], c, now=2, discipline=DISCIPLINES["mlfq"](CONFIG))
    assert d.preempt == [] and "waiting for preempted work to stop" in d.waiting["new"].reason


def test_fifo_blocks_behind_the_head_and_never_preempts():
    c = cluster(node("n1", 1000))
    d = decide(
        [work("big", gpus=2), work("small", submitted=1)],
        [running("x", preemptible=True, attained=1e9)],
        c,
        now=2,
        discipline=DISCIPLINES["fifo"](),
    )
    assert d.place == [] and d.preempt == [] and "behind earlier work" in d.waiting["small"].reason


def test_demotions_and_promotions_are_reported():
    c = cluster(node("n1", 0))
    sinking = running("sinking", attained=500.0, level=0)
    starved = work("starved", attained=5000.0, level=2, submitted=0)
    d = decide([starved], [sinking], c, now=600, discipline=DISCIPLINES["mlfq"](CONFIG))
    assert d.demoted == ["sinking"] and d.promoted == ["starved"]


def test_a_users_priority_orders_only_their_own_work_and_never_jumps_anothers():
    c = cluster(node("n1", 1000))
    alice_normal = work("alice", user="alice", submitted=1)
    bob_low = work("bob-low", user="bob", submitted=0, priority=LOW)
    bob_high = work("bob-high", user="bob", submitted=2, priority=HIGH)
    d = decide(
        [alice_normal, bob_low, bob_high], [], c, now=3, discipline=DISCIPLINES["mlfq"](CONFIG), strategy="bestfit"
    )
    # Bob's high-priority work takes the place of his own earlier low-priority work, not Alice's.
    assert [p.work_id for p in d.place] == ["bob-high"]
    assert d.waiting["alice"].position == 1 and d.waiting["bob-low"].position == 2

    later = work("bob-high-2", user="bob", submitted=2, priority=HIGH)
    d = decide(
        [alice_normal, later],
        [],
        cluster(node("n1", 1000)),
        now=3,
        discipline=DISCIPLINES["mlfq"](CONFIG),
        strategy="bestfit",
    )
    assert [p.work_id for p in d.place] == ["alice"]
