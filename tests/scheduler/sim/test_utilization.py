"""Per-job utilization for trace replay: the distribution, the seeded generator, and the simulator's accrual."""

from datetime import UTC, datetime, timedelta

import pytest

from scheduler.models import WorkloadGpuMinute
from scheduler.selectors import workload_utilizations
from scheduler.sim.simulator import simulate, uniform_nodes
from scheduler.sim.traces import TraceJob
from scheduler.sim.utilization import PAI_2020, Distribution, attach, measured
from tests.conftest import make_node
from tests.scheduler.factories import workload


def test_the_pai_distribution_keeps_the_published_quantiles():
    assert PAI_2020.quantile(0.30) == 0.0  # 34.5 % of instances at exactly 0
    assert PAI_2020.quantile(0.50) == pytest.approx(0.015)
    assert PAI_2020.quantile(0.754) == pytest.approx(0.10)
    assert PAI_2020.quantile(0.95) == pytest.approx(0.50)
    assert PAI_2020.mean() == pytest.approx(0.112, abs=0.001)  # the published mean is 0.105


def test_drawn_utilizations_follow_the_distribution():
    jobs = attach([TraceJob(i, 0, 60, 1) for i in range(20000)], PAI_2020, seed=3)
    values = sorted(j.utilization for j in jobs)
    assert sum(v == 0 for v in values) / len(values) == pytest.approx(0.345, abs=0.01)
    assert values[len(values) // 2] == pytest.approx(0.015, abs=0.003)
    assert sum(v < 0.30 for v in values) / len(values) == pytest.approx(PAI_2020.share_below(0.30), abs=0.01)


def test_a_job_keeps_its_utilization_whatever_window_it_is_replayed_in():
    jobs = [TraceJob(i, i, 60, 1) for i in range(100)]
    whole = {j.id: j.utilization for j in attach(jobs, seed=7)}
    part = {j.id: j.utilization for j in attach(jobs[50:], seed=7)}
    assert all(whole[i] == u for i, u in part.items())
    assert whole != {j.id: j.utilization for j in attach(jobs, seed=8)}
    assert all(j.utilization is None for j in jobs)  # copies: the trace's own jobs are untouched


def test_a_measured_distribution_replays_what_was_measured():
    dist = measured([0.2, 0.2, 0.9, 1.4], name="rollups")
    assert dist.mean() == pytest.approx((0.2 + 0.2 + 0.9 + 1.0) / 4)
    drawn = [j.utilization for j in attach([TraceJob(i, 0, 60, 1) for i in range(2000)], dist)]
    assert set(drawn) == {0.2, 0.9, 1.0}
    assert drawn.count(0.2) / len(drawn) == pytest.approx(0.5, abs=0.04)


def test_it_refuses_points_that_are_not_a_distribution():
    with pytest.raises(ValueError, match="bad: points"):
        Distribution("bad", ((0.5, 0.6), (0.2, 1.0)))
    with pytest.raises(ValueError, match="no measured utilization"):
        measured([])


def two_jobs(idle: float | None, busy: float | None) -> list[TraceJob]:
    # One card, two jobs of 2 h arriving together; the idle one (id 0) starts first.
    return [TraceJob(0, 0, 7200, 1, utilization=idle), TraceJob(1, 0, 7200, 1, utilization=busy)]


def test_idle_work_accrues_service_slower_and_keeps_its_card():
    weighted = simulate(two_jobs(0.1, 0.9), uniform_nodes(1), policy="mlfq", quantum=60)
    unknown = simulate(two_jobs(None, None), uniform_nodes(1), policy="mlfq", quantum=60)
    plain_las = simulate(two_jobs(0.1, 0.9), uniform_nodes(1), policy="las", quantum=60)
    # At a quarter of the rate, 2 h of running is 1,800 GPU-s: still the top queue, never preempted.
    assert weighted.done[0] == 7200 and weighted.preemptions == 0
    # Unknown utilization (and plain LAS) count every second: at 1 h it sinks and the busy job evicts it.
    assert unknown.done[0] > 4 * 3600 - 60 and unknown.preemptions == 1
    assert plain_las.done[0] == unknown.done[0]


@pytest.mark.django_db
def test_the_rollups_give_each_workload_its_average_and_the_simulator_replays_them(user):
    gpu = make_node("sim:1xRTX3090").gpus.get()
    start = datetime(2026, 12, 1, tzinfo=UTC)
    for utils in ([0.1, 0.3] * 6, [0.9] * 12, [1.0] * 3):  # the last one measured too briefly
        w = workload(user)
        WorkloadGpuMinute.objects.bulk_create(
            WorkloadGpuMinute(minute=start + timedelta(minutes=i), gpu=gpu, workload=w, samples=60, util_avg=u)
            for i, u in enumerate(utils)
        )
    values = workload_utilizations(min_minutes=10)
    assert values == [pytest.approx(0.2), pytest.approx(0.9)]
    assert {j.utilization for j in attach([TraceJob(i, 0, 60, 1) for i in range(50)], measured(values))} == {0.2, 0.9}
