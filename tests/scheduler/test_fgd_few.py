"""FGD's scores of a few nodes in plain Python (``policy.fgd_few``) are the array path's, to the bit."""

import random

import numpy as np
import pytest

from scheduler.policy import fgd_few, placement
from scheduler.policy.cluster import MIXED, NO_CLASS, WHOLE_CARD, CardSpec, ClusterState, NodeSpec
from scheduler.policy.placement import Request, TaskType, choose

SIZES = (100, 250, 300, 500)


def random_card(rng: random.Random, pk: int) -> CardSpec:
    model = rng.choice(["A100", "A100", "T4"])
    memory = 40_000 if model == "A100" else 16_000
    kind = rng.random()
    if kind < 0.35:
        return CardSpec(pk, model, memory)  # empty
    if kind < 0.5:
        return CardSpec(pk, model, memory, 0, 0)  # taken whole
    size = rng.choice(SIZES)
    held = size * rng.randint(1, WHOLE_CARD // size)
    share_class = MIXED if rng.random() < 0.1 else size
    if rng.random() < 0.1:
        share_class = NO_CLASS  # fractions whose size is not known
    return CardSpec(pk, model, memory, WHOLE_CARD - held, memory - memory * held // WHOLE_CARD, share_class)


def random_cluster(rng: random.Random, rule: bool, count: int = 12) -> ClusterState:
    nodes = []
    for node in range(count):
        cards = [random_card(rng, node * 10 + c) for c in range(rng.choice([2, 4, 8, 8]))]
        disk = rng.choice([None, 50, 500])
        nodes.append(
            NodeSpec(node, rng.choice([2, 8, 32, 96]), rng.choice([4096, 65536, 500_000]), cards, disk_free_gb=disk)
        )
    return ClusterState(nodes, one_size_per_card=rule)


def random_mix(rng: random.Random) -> list[TaskType]:
    types = []
    for _ in range(rng.randint(1, 9)):
        kind = rng.random()
        count, milli = (
            (0, 0) if kind < 0.1 else (1, rng.choice(SIZES)) if kind < 0.5 else (rng.choice([1, 2, 4, 8]), 1000)
        )
        types.append(TaskType(count, milli, rng.choice([0, 4, 16]), rng.choice([0, 8192, 100_000]), rng.randint(1, 60)))
    return types


def random_request(rng: random.Random) -> Request:
    fraction = rng.random() < 0.5
    return Request(
        1,
        rng.choice([None, "A100", "T4"]),
        1 if fraction else rng.choice([0, 1, 2, 4, 8]),
        rng.choice(SIZES) if fraction else WHOLE_CARD,
        rng.choice([0, 2, 8]),
        rng.choice([0, 4096, 32768]),
        disk_gb=rng.choice([0, 100]),
    )


def scored(cluster, request, arrays, stale) -> placement._Scores:
    count = len(cluster.node_ids)
    scores = placement._Scores(None, None, np.full(count, np.inf), np.zeros(count), np.zeros(count, np.int64))
    placement._rescore(cluster, request, arrays, stale, scores)
    return scores


@pytest.mark.parametrize("rule", [True, False])
def test_a_few_nodes_score_in_plain_python_exactly_as_over_the_arrays(rule):
    rng = random.Random(7)
    for _ in range(400):
        cluster, mix, request = random_cluster(rng, rule), random_mix(rng), random_request(rng)
        arrays = placement._mix_arrays(mix)
        stale = np.array(sorted(rng.sample(range(12), rng.randint(1, fgd_few.FEW_NODES))))
        few = scored(cluster, request, arrays, stale)
        over_arrays = scored(cluster, request, arrays._replace(rows=None), stale)
        assert few.delta.tolist() == over_arrays.delta.tolist()
        placed = np.isfinite(over_arrays.delta)
        assert few.tiebreak[placed].tolist() == over_arrays.tiebreak[placed].tolist()
        if 0 < request.gpu_milli < WHOLE_CARD:
            assert few.card[placed].tolist() == over_arrays.card[placed].tolist()


def test_the_few_path_runs_where_the_weights_are_counts_and_only_there(monkeypatch):
    cluster = random_cluster(random.Random(3), True, count=fgd_few.FEW_NODES + 1)
    calls = []
    monkeypatch.setattr(fgd_few, "rescore", lambda *args: calls.append(args[3].tolist()))
    request = Request(1, None, 1, WHOLE_CARD)
    counts = [TaskType(1, 1000, 0, 0, 3), TaskType(1, 500, 0, 0, 1)]
    rates = [TaskType(1, 1000, 0, 0, 0.75), TaskType(1, 500, 0, 0, 0.25)]
    choose(cluster, request, "fgd", mix=counts)  # every node is new: over the arrays
    cluster.take(0, [0], WHOLE_CARD, 0, 0)
    choose(cluster, request, "fgd", mix=counts)
    assert calls == [[0]]
    assert placement._mix_arrays(rates).rows is None  # such a mix is always scored over the arrays
