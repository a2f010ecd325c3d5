"""The simulator keeps the product's fractions: trace shares rounded up to offered sizes, one size per card."""

from scheduler.sim.simulator import simulate, uniform_nodes
from scheduler.sim.traces import TraceJob


def test_a_half_waits_for_the_quarter_on_the_only_card_to_finish():
    jobs = [TraceJob(0, 0, 100, 1, 250), TraceJob(1, 1, 10, 1, 500)]
    ruled = simulate(jobs, uniform_nodes(1), share_sizes=(250, 500))
    free_form = simulate(jobs, uniform_nodes(1), share_sizes=None, one_size_per_card=False)
    assert ruled.first_start[1] == 100
    assert free_form.first_start[1] == 1


def test_trace_fractions_round_up_to_the_next_offered_size():
    # 0.45 + 0.45 + 0.1 fill a card exactly as asked; rounded up, two halves fill it and the 0.1 (a size of
    # its own) waits until the card is empty again.
    jobs = [TraceJob(0, 0, 100, 1, 450), TraceJob(1, 0, 200, 1, 450), TraceJob(2, 1, 10, 1, 100)]
    exact = simulate(jobs, uniform_nodes(1), share_sizes=None, one_size_per_card=False)
    offered = simulate(jobs, uniform_nodes(1), share_sizes=(100, 500))
    assert exact.first_start[2] == 1
    assert offered.first_start[2] == 200


def test_a_fraction_above_the_largest_offered_size_takes_a_whole_card():
    jobs = [TraceJob(0, 0, 100, 1, 810), TraceJob(1, 1, 10, 1, 100)]
    result = simulate(jobs, uniform_nodes(1), share_sizes=(100, 500))
    assert result.first_start[1] == 100
