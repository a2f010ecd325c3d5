"""The live tick honours a group's running cap and moves spot members to on-demand when they fall back."""

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler import tick
from scheduler.models import Workload, WorkloadGroup, WorkloadStatus
from scheduler.services.lifecycle import workload_transition
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db(transaction=True)
S = WorkloadStatus


def test_the_tick_starts_at_most_the_groups_cap_and_the_rest_stays_queued_saying_why(user):
    make_node("sim:4xRTX3090", cpu_cores=16)
    group = WorkloadGroup.objects.create(name="array 1", max_running=2)
    tasks = [workload(user, kind="job", name=f"t{i}", group=group, preemptible=True) for i in range(4)]
    assert len(tick.schedule_tick().placed) == 2
    statuses = sorted(Workload.objects.filter(group=group).values_list("status", flat=True))
    assert statuses == [S.QUEUED, S.QUEUED, S.STARTING, S.STARTING]
    waiting = Workload.objects.filter(group=group, status=S.QUEUED).first()
    assert "at most 2 of its array run at once" in waiting.status_reason

    # One finishes: exactly one more starts; other work is not held back by the cap.
    done = Workload.objects.filter(group=group, status=S.STARTING).first()
    assert workload_transition(done, to=S.SUCCEEDED, allowed_from=[S.STARTING], reason="exited 0")
    other = workload(user, name="other")
    placed = tick.schedule_tick().placed
    assert other.pk in placed and len([p for p in placed if p in {t.pk for t in tasks}]) == 1


def test_a_queued_spot_member_preempted_too_often_runs_on_demand_from_the_next_tick(user):
    make_node("sim:1xRTX3090")
    group = WorkloadGroup.objects.create(name="array 2", spot_fallback_after=3)
    tired = workload(user, kind="job", group=group, spot=True, preemptible=True, preemptions=4)
    fresh = workload(user, kind="job", group=group, spot=True, preemptible=True, preemptions=3, gpu_model="H100")
    tick.schedule_tick()
    tired.refresh_from_db(), fresh.refresh_from_db()
    assert not tired.spot and fresh.spot
    assert tired.events.filter(
        reason__contains="on-demand from now on: preempted more often than its array allows (4 > 3)"
    ).exists()


def test_queued_spot_members_run_on_demand_once_the_groups_deadline_passed(user):
    make_node("sim:1xRTX3090")
    group = WorkloadGroup.objects.create(name="array 3", spot_fallback_at=timezone.now() - timedelta(seconds=1))
    late = workload(user, kind="job", group=group, spot=True, preemptible=True, gpu_model="H100")
    tick.schedule_tick()
    late.refresh_from_db()
    assert not late.spot and late.events.filter(reason__contains="past its deadline").exists()
