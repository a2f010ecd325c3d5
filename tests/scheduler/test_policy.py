"""The placement policy, straight on plain objects (no database)."""

from scheduler.policy import Card, NodeCapacity, Request, place


def node(node_id, *cards, cpu=64, memory=262144):
    return NodeCapacity(node_id, cpu, memory, list(cards))


def card(card_id, model="A100", free=1000, memory=81920):
    return Card(card_id, model, memory, free, memory * free // 1000)


def test_it_only_places_on_the_requested_model():
    nodes = [node("n1", card("a", model="V100")), node("n2", card("b", model="A100"))]
    [placement] = place([Request(1, "A100")], nodes)
    assert placement.node_id == "n2"
    assert place([Request(2, "H100")], nodes) == []


def test_it_packs_a_fraction_onto_the_fullest_card_that_fits():
    nodes = [node("n1", card("whole"), card("half", free=500), card("tenth", free=100))]
    [placement] = place([Request(1, "A100", gpu_milli=300)], nodes)
    assert [s.card_id for s in placement.shares] == ["half"]
    assert nodes[0].cards[0].free_milli == 1000


def test_it_gives_a_fraction_memory_in_proportion():
    nodes = [node("n1", card("c", memory=80000))]
    [placement] = place([Request(1, "A100", gpu_milli=250)], nodes)
    assert placement.shares[0].memory_mb == 20000


def test_multi_card_work_is_all_or_nothing_on_one_node():
    nodes = [node("n1", card("a"), card("b")), node("n2", card("c"), card("d", free=500))]
    assert place([Request(1, "A100", gpu_count=3)], nodes) == []
    [placement] = place([Request(2, "A100", gpu_count=2)], nodes)
    assert placement.node_id == "n1"


def test_whole_cards_go_where_they_leave_the_fewest_free_cards():
    big = node("big", *[card(f"b{i}") for i in range(8)])
    small = node("small", card("s0"), card("s1"))
    [placement] = place([Request(1, "A100")], [big, small])
    assert placement.node_id == "small"


def test_it_checks_cpu_and_host_memory_too():
    nodes = [node("n1", card("a"), cpu=4, memory=8192)]
    assert place([Request(1, "A100", cpu=8)], nodes) == []
    assert place([Request(2, "A100", memory_mb=16384)], nodes) == []
    assert len(place([Request(3, "A100", cpu=4, memory_mb=8192)], nodes)) == 1


def test_one_call_never_hands_out_a_share_twice():
    nodes = [node("n1", card("a", free=500))]
    placements = place([Request(1, "A100", gpu_milli=500), Request(2, "A100", gpu_milli=500)], nodes)
    assert [p.request_id for p in placements] == [1]
    assert nodes[0].cards[0].free_milli == 0


def test_pinned_work_goes_back_to_its_node_or_waits():
    nodes = [node("n1", card("a", free=0)), node("n2", card("b"))]
    assert place([Request(1, "A100", pinned_node="n1")], nodes) == []
    [placement] = place([Request(2, "A100", pinned_node="n2")], nodes)
    assert placement.node_id == "n2"
