"""The simulator honours a group's running cap, evicts spot work for on-demand work, and falls back."""

from scheduler.sim.simulator import simulate, uniform_nodes
from scheduler.sim.traces import TraceJob


def concurrent_max(runs: dict, ids) -> int:
    edges = sorted((t, d) for i in ids for (start, end, _) in runs[i] for t, d in ((start, 1), (end, -1)))
    most = now = 0
    for _, d in edges:
        now += d
        most = max(most, now)
    return most


def test_at_most_the_cap_of_a_group_runs_at_once_though_cards_are_free():
    tasks = [TraceJob(i, 0.0, 100.0, 1, group="a", group_cap=3) for i in range(8)]
    result = simulate(tasks, uniform_nodes(8), policy="mlfq", quantum=10)
    assert result.finished == 8
    assert concurrent_max(result.runs, range(8)) == 3
    assert result.makespan == 300.0  # three waves of a hundred seconds (8 tasks, 3 at a time)


def test_spot_tasks_are_evicted_by_on_demand_work_and_resume():
    sweep = [TraceJob(i, 0.0, 1000.0, 1, spot=True) for i in range(2)]
    burst = [TraceJob(10 + i, 100.0, 200.0, 1) for i in range(2)]
    result = simulate([*sweep, *burst], uniform_nodes(2), policy="mlfq", quantum=10, grace=5)
    assert all(result.preempted[i] == 1 for i in range(2))
    assert result.finished == 4
    assert all(not spot for i in (10, 11) for (_, _, spot) in result.runs[i])


def test_a_spot_task_preempted_more_than_allowed_resumes_on_demand():
    task = TraceJob(0, 0.0, 1000.0, 1, spot=True, fallback_after=1)
    bursts = [TraceJob(10 + i, 100.0 + 300 * i, 50.0, 1) for i in range(4)]
    result = simulate([task, *bursts], uniform_nodes(1), policy="mlfq", quantum=10, grace=5)
    assert result.preempted[0] == 2  # preempted twice: more than once, so on-demand after that
    assert [spot for (_, _, spot) in result.runs[0]] == [True, True, False]
