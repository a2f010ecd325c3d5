"""One share size per card in the policy: a card's class, what may join it, FGD's view of it, eviction."""

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.policy import (
    SHARE_SIZES,
    CardSpec,
    ClusterState,
    NodeSpec,
    Request,
    TaskType,
    Work,
    choose,
    decide,
    round_up_share,
    share_class_of,
)
from scheduler.policy.cluster import MIXED, NO_CLASS, WHOLE_CARD
from scheduler.policy.placement import fragmentation


def card(name, free=1000, share_class=NO_CLASS):
    return CardSpec(name, "A100", 80000, free, 80 * free, share_class)


def cluster(*cards, one_size_per_card=True):
    return ClusterState([NodeSpec("n1", 64, 262144, list(cards))], one_size_per_card=one_size_per_card)


def fraction(milli, work_id=1):
    return Request(work_id, "A100", 1, milli)


def test_a_half_is_not_placed_on_a_card_holding_a_quarter():
    c = cluster(card("c0", 750, 250))
    for strategy in ("fgd", "bestfit", "firstfit", "random"):
        assert choose(c, fraction(500), strategy, mix=[TaskType(1, 500, 0, 0, 1)]) is None


def test_a_half_goes_to_an_empty_card_beside_a_card_holding_a_quarter():
    c = cluster(card("c0", 750, 250), card("c1"))
    assert choose(c, fraction(500), "bestfit").cards == [1]


def test_a_quarter_joins_the_card_of_its_size_rather_than_an_empty_one():
    c = cluster(card("c0"), card("c1", 750, 250), card("c2", 500, 500))
    assert choose(c, fraction(250), "bestfit").cards == [1]


def test_the_first_fraction_on_an_empty_card_sets_its_class_and_the_last_to_leave_clears_it():
    c = cluster(card("c0"))
    c.take(0, [0], 250, 0, 0)
    c.take(0, [0], 250, 0, 0)
    assert c.card_class[0, 0] == 250
    assert choose(c, fraction(500), "bestfit") is None
    c.give(0, [0], 250, 0, 0)
    assert c.card_class[0, 0] == 250  # a quarter is still there
    c.give(0, [0], 250, 0, 0)
    assert c.card_class[0, 0] == NO_CLASS
    assert choose(c, fraction(500), "bestfit").cards == [0]
    assert choose(c, Request(2, "A100"), "bestfit").cards == [0]


def test_a_whole_card_sets_no_class():
    c = cluster(card("c0"))
    c.take(0, [0], WHOLE_CARD, 0, 0)
    assert c.card_class[0, 0] == NO_CLASS
    c.give(0, [0], WHOLE_CARD, 0, 0)
    assert choose(c, fraction(200), "bestfit").cards == [0]


def test_a_card_holding_several_sizes_from_before_the_rule_takes_no_new_fraction_until_empty():
    assert share_class_of([300, 500]) == MIXED
    c = cluster(card("c0", 200, MIXED))
    assert choose(c, fraction(100), "bestfit") is None
    c.give(0, [0], 800, 0, 0)
    assert choose(c, fraction(100), "bestfit").cards == [0]


def test_a_cards_class_comes_from_its_fractions_and_an_empty_spec_has_none():
    assert share_class_of([]) == share_class_of([1000, 1000]) == NO_CLASS
    assert share_class_of([250, 250]) == 250
    c = cluster(card("c0", 1000, 250), card("c1", 500, 500))
    assert c.card_class.tolist() == [[NO_CLASS, 500]]


def test_a_copy_keeps_its_classes_apart():
    c = cluster(card("c0"))
    scratch = c.copy()
    scratch.take(0, [0], 250, 0, 0)
    assert c.card_class[0, 0] == NO_CLASS and scratch.card_class[0, 0] == 250


def test_free_form_mode_lets_any_sizes_share_a_card():
    c = cluster(card("c0", 750, 250), one_size_per_card=False)
    assert choose(c, fraction(500), "bestfit").cards == [0]


def test_fgd_keeps_an_empty_card_for_other_sizes_by_joining_a_card_of_its_own():
    # Two cards: one serves quarters with room for three more, one is empty. A quarter on the empty card
    # would leave no card for the halves and whole cards of the mix.
    c = cluster(card("c0", 750, 250), card("c1"))
    mix = [TaskType(1, 250, 0, 0, 1), TaskType(1, 500, 0, 0, 1), TaskType(1, 1000, 0, 0, 1)]
    assert choose(c, fraction(250), "fgd", mix=mix).cards == [0]


def test_fgd_counts_share_on_a_card_of_another_size_as_a_fragment():
    mix = [TaskType(1, 500, 0, 0, 1)]
    other_size = cluster(card("c0", 750, 250))
    empty = cluster(card("c0"))
    assert fragmentation(other_size, mix) == 0.75  # a half cannot use the quarters' card
    assert fragmentation(empty, mix) == 0
    assert fragmentation(cluster(card("c0", 750, 250), one_size_per_card=False), mix) == 0


def test_evicting_the_last_fraction_of_another_size_makes_room():
    c = cluster(card("c0", 750, 250))
    spot = Work(1, "u", fraction(250, 1), submitted=0, waiting_since=0, spot=True, preemptible=True)
    spot.node, spot.cards = 0, [0]
    waiter = Work(2, "v", fraction(500, 2), submitted=1, waiting_since=1)
    d = decide([waiter], [spot], c, now=2, strategy="bestfit")
    assert [p.work_id for p in d.preempt] == [1]


def test_the_waiting_reason_says_the_room_is_on_cards_of_another_size():
    c = cluster(card("c0", 750, 250))
    d = decide([Work(2, "v", fraction(500, 2), submitted=0, waiting_since=0)], [], c, now=1, strategy="bestfit")
    reason = d.waiting[2].reason
    assert "no A100 card has 0.5 free" in reason and "one share size per card" in reason


def test_requests_round_up_to_the_next_offered_size():
    sizes = (100, 250, 500)
    assert [round_up_share(m, sizes) for m in (1, 100, 101, 250, 470, 501, 1000)] == [
        100,
        100,
        250,
        250,
        500,
        1000,
        1000,
    ]
    assert all(WHOLE_CARD % size == 0 for size in SHARE_SIZES)  # each offered size fills a card exactly


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from([100, 200, 250, 500, 1000]), st.sampled_from(["fgd", "bestfit"]), st.booleans()),
        max_size=40,
    )
)
def test_no_sequence_of_placements_and_departures_mixes_sizes_on_a_card(steps):
    c = ClusterState([NodeSpec(f"n{i}", 64, 262144, [card(f"n{i}/{j}") for j in range(2)]) for i in range(2)])
    mix = [TaskType(1, size, 0, 0, 1) for size in (100, 200, 250, 500, 1000)]
    held = []  # (node, card, milli) of what is placed
    for milli, strategy, leave in steps:
        if leave and held:
            node, column, size = held.pop(0)
            c.give(node, [column], size, 0, 0)
            continue
        choice = choose(c, Request(len(held), "A100", 1, milli), strategy, mix=mix)
        if choice is not None:
            c.take(choice.node, choice.cards, milli, 0, 0)
            held.append((choice.node, choice.cards[0], milli))
        on = {}
        for node, column, size in held:
            on.setdefault((node, column), set()).add(size)
        assert all(len(sizes) == 1 for sizes in on.values())
        for (node, column), sizes in on.items():
            size = next(iter(sizes))
            assert c.card_class[node, column] == (NO_CLASS if size == WHOLE_CARD else size)
