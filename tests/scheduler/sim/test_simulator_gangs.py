"""The simulator with gangs across nodes and elastic jobs (the same decide code as live)."""

import pytest

from scheduler.policy import MlfqConfig
from scheduler.sim.simulator import simulate, speedup, uniform_nodes
from scheduler.sim.traces import TraceJob


def test_work_wider_than_a_node_runs_as_a_gang_and_gives_every_card_back():
    jobs = [TraceJob(0, 0, 100, 16), TraceJob(1, 10, 50, 8), TraceJob(2, 20, 10, 1)]
    result = simulate(jobs, uniform_nodes(16), policy="fifo")
    assert result.finished == 3
    # The gang holds both nodes until 100; then the 8-card job, then the 1-card job beside it.
    assert result.done == {0: 100, 1: 150, 2: 110}


def test_a_gang_bigger_than_the_cluster_never_runs_and_nothing_else_is_lost():
    jobs = [TraceJob(0, 0, 100, 32), TraceJob(1, 0, 50, 8)]
    result = simulate(jobs, uniform_nodes(16), policy="mlfq")
    assert result.done == {1: 50}


def test_elastic_work_shrinks_for_higher_queue_work_and_grows_back_paying_the_restart_each_time():
    config = MlfqConfig(thresholds=(50.0, 10**6), resize_interval_s=5.0)
    jobs = [TraceJob(0, 0, 1000, 8, elastic_min=4), TraceJob(1, 10, 100, 4)]
    result = simulate(jobs, uniform_nodes(8), policy="mlfq", config=config, restart_s=5)
    assert result.resizes == 2
    assert result.done[1] == pytest.approx(110)
    # 0..10 on 8 cards (10 s of its 1000), 10..110 on 4 cards less a 5 s restart (47.5 s), then a 5 s
    # restart on 8 cards and the 942.5 s left.
    assert result.done[0] == pytest.approx(110 + 5 + 1000 - 10 - 47.5)


def test_rigid_and_elastic_alike_when_nothing_competes():
    rigid = [TraceJob(0, 0, 500, 8)]
    elastic = [TraceJob(0, 0, 500, 8, elastic_min=2)]
    assert simulate(rigid, uniform_nodes(8)).done == simulate(elastic, uniform_nodes(8)).done == {0: 500}


def test_cards_above_the_asked_size_are_worth_scale_above_of_a_card_each():
    # Asked 4, may use 8: alone on 8 cards it starts at 8 and advances at 1 + 0.5 * 4 / 4 = 1.5x.
    jobs = [TraceJob(0, 0, 900, 4, elastic_min=2, elastic_max=8)]
    assert simulate(jobs, uniform_nodes(8), scale_above=0.5).done == {0: pytest.approx(600)}
    assert simulate(jobs, uniform_nodes(8), scale_above=1.0).done == {0: pytest.approx(450)}
    assert speedup(2, 4, 0.5) == 0.5 and speedup(4, 4, 0.5) == 1.0  # linear up to the asked size
