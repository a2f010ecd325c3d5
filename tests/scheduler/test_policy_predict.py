"""Duration prediction (issue 32 §3): learned from an owner's past jobs, used inside an MLFQ queue, never trusted
blindly; the same ``decide`` in the live tick (SCHEDULER_PREDICT) as in the simulator (MlfqConfig.predict)."""

import pytest
from django.utils import timezone

from scheduler import tick
from scheduler.models import Workload, WorkloadKind, WorkloadStatus
from scheduler.policy import HIGH, LOW, ClusterState, MlfqConfig, Request, Work, decide
from scheduler.policy.decide import DISCIPLINES
from scheduler.policy.predict import DurationHistory
from tests.conftest import make_node
from tests.scheduler.factories import workload
from tests.scheduler.test_policy import node

CONFIG = MlfqConfig(thresholds=(100.0, 1000.0), starvation_s=10_000.0, predict=True)


def work(work_id, *, submitted, predicted=None, attained=0.0, user="u", **fields):
    return Work(
        work_id,
        user,
        Request(work_id, "A100"),
        submitted=submitted,
        waiting_since=submitted,
        predicted=predicted,
        attained=attained,
        **fields,
    )


def placed(waiting, config=CONFIG) -> list:
    one_card = ClusterState([node("n1", 1000)])
    return [p.work_id for p in decide(waiting, [], one_card, now=5, discipline=DISCIPLINES["mlfq"](config)).place]


def test_the_history_predicts_the_median_of_the_owners_last_runs_of_the_most_specific_kind():
    history = DurationHistory(keep=3, least=2)
    history.record("ann", "torch", 1, 10.0)
    assert history.predict("ann", "torch", 1) is None  # one run is no history
    history.record("ann", "tf", 1, 50.0)
    assert history.predict("ann", "torch", 1) == 30.0  # (ann, 1 card) of any image: 10 and 50
    for seconds in (20.0, 40.0, 100.0, 200.0):
        history.record("ann", "torch", 1, seconds)
    assert history.predict("ann", "torch", 1) == 100.0  # its image's last three: 40, 100, 200
    assert history.predict("ann", "torch", 2) is None and history.predict("bob", "torch", 1) is None


def test_with_prediction_the_job_expected_to_end_first_goes_first():
    long, short = work("long", submitted=0, predicted=80.0), work("short", submitted=1, predicted=5.0)
    assert placed([long, short]) == ["short"]
    assert placed([long, short], MlfqConfig(thresholds=(100.0, 1000.0))) == ["long"]  # off: first come


def test_a_job_past_its_prediction_is_not_trusted_and_sorts_by_its_attained_service():
    # Predicted 10 s, it has run 60: no longer "short". It expects as much again as it attained, at least the
    # first queue's 100 GPU-seconds, and so goes after work whose prediction still holds (90 left).
    outlived = work("outlived", submitted=0, predicted=10.0, attained=60.0)
    assert placed([outlived, work("ninety", submitted=1, predicted=90.0)]) == ["ninety"]
    assert placed([outlived, work("unknown", submitted=1)]) == ["outlived"]  # both 100: first come


def test_a_users_priority_still_orders_their_own_work_and_never_jumps_anothers():
    low_short = work("low-short", submitted=0, predicted=5.0, priority=LOW)
    high_long = work("high-long", submitted=1, predicted=80.0, priority=HIGH)
    assert placed([low_short, high_long]) == ["high-long"]
    other = work("other", submitted=2, predicted=40.0, user="v")
    assert placed([other, high_long]) == ["other"]  # bob's "high" takes his own place in line, not another's


def _past_job(user, image: str, service: float):
    return workload(
        user, kind=WorkloadKind.JOB, image_ref=image, status=WorkloadStatus.RELEASED, exit_code=0,
        attained_service=service, finished_at=timezone.now(),
    )  # fmt: skip


@pytest.mark.parametrize("predict", [False, True])
def test_the_live_tick_orders_queued_jobs_by_what_their_owners_past_jobs_took(user, settings, predict):
    settings.SCHEDULER_PREDICT = predict
    make_node("sim:1xRTX3090", cpu_cores=8)
    for _ in range(3):
        _past_job(user, "img/long", 50_000.0)
        _past_job(user, "img/short", 30.0)
    cancelled = [_past_job(user, "img/short", 90_000.0).pk for _ in range(4)]
    Workload.objects.filter(pk__in=cancelled).update(exit_code=None)  # stopped by their owner: they say nothing
    first = workload(user, kind=WorkloadKind.JOB, image_ref="img/long", name="first")
    second = workload(user, kind=WorkloadKind.JOB, image_ref="img/short", name="second")

    assert tick.schedule_tick().placed == [second.pk if predict else first.pk]
