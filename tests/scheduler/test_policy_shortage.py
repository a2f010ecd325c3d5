"""A queued request's reason names the resource that is really short: cards, or the host's CPU or memory."""

from scheduler.policy import CardSpec, ClusterState, NodeSpec, Request, Work, decide


def node(node_id, *frees, cpu=8, memory=65536, model="RTX3090"):
    cards = [CardSpec(f"{node_id}/{i}", model, 24576, free, 24576 * free // 1000) for i, free in enumerate(frees)]
    return NodeSpec(node_id, cpu, memory, cards)


def reason(nodes, *, gpus=1, milli=1000, cpu=1, memory=1024, model="RTX3090", pinned=None):
    work = Work(1, "u", Request(1, model, gpus, milli, cpu, memory, pinned), submitted=0, waiting_since=0)
    return decide([work], [], ClusterState(nodes), now=1, strategy="bestfit").waiting[1].reason


def test_a_fraction_that_fits_the_card_but_not_the_cores_says_cpu_cores():
    text = reason([node("n1", 1000, cpu=2)], milli=400, cpu=4)
    assert "the nodes with 0.4 of a RTX3090 card free have too few free CPU cores" in text
    assert "card has" not in text


def test_whole_cards_that_fit_but_not_the_memory_say_memory():
    text = reason([node("n1", 1000, 1000, memory=2048)], gpus=2, memory=4096)
    assert "the nodes with 2 free RTX3090 cards have too little free memory" in text


def test_cores_on_one_node_and_memory_on_another_say_both_together():
    text = reason([node("n1", 1000, cpu=8, memory=1024), node("n2", 1000, cpu=1, memory=65536)], cpu=4, memory=4096)
    assert "not enough free CPU cores and memory together" in text


def test_when_the_cards_are_short_the_cards_are_named():
    assert "no RTX3090 card has 0.4 free" in reason([node("n1", 300, cpu=1)], milli=400, cpu=4)


def test_only_nodes_with_the_cards_count_for_the_host_resources():
    # n2 has the cores but no free card; n1 has the card but not the cores: the cores are what is short.
    text = reason([node("n1", 1000, cpu=1), node("n2", 0, cpu=64)], cpu=4)
    assert "the nodes with 1 free RTX3090 card have too few free CPU cores" in text


def test_a_pinned_request_looks_only_at_its_node():
    text = reason([node("n1", 1000, cpu=1), node("n2", 0, cpu=64)], cpu=4, pinned="n2")
    assert "no free RTX3090 card" in text
