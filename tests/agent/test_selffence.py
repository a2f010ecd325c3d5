"""A node cut off from the control plane stops its jobs itself, and reports them when it is heard again."""

import time

import pytest

from agent import launcher
from agent.reconcile import agent_reconcile
from agent.selffence import SelfFence
from billing.models import MeterSegment
from core.clock import AgentClock
from scheduler.models import WorkloadStatus
from tests.agent.test_agent import running_instance
from tests.conftest import make_node, remove_node_containers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def node(settings, tmp_path):
    settings.SELF_FENCE_AFTER_S = 2
    settings.PREEMPTION_GRACE_S = 1
    settings.AGENT_STATE_DIR = tmp_path
    node = make_node("sim:2xRTX3090")
    yield node
    remove_node_containers(node.name)


def running(w) -> bool:
    state = launcher.containers_on_node(w.node.name).get(w.uid)
    return state is not None and state.running


def cut_off(fence: SelfFence, seconds: float) -> None:
    fence._last_contact = time.monotonic() - seconds  # no heartbeat went through for that long


def test_a_node_in_contact_fences_nothing(user, node, base_image):
    job = running_instance(user, node, base_image, kind="job", command=["sleep", "600"])
    fence = SelfFence(node.name, AgentClock())
    cut_off(fence, 1)
    assert fence.check() == []
    assert running(job)


def test_a_cut_off_node_stops_its_jobs_but_not_its_instances(user, node, base_image):
    job = running_instance(user, node, base_image, kind="job", command=["sleep", "600"])
    instance = running_instance(user, node, base_image)
    fence = SelfFence(node.name, AgentClock())
    cut_off(fence, 3)

    assert fence.check() == [job.pk]

    assert not running(job) and running(instance)
    assert fence.cut_off and set(fence.pending()) == {job.pk}


def test_jobs_stopped_while_cut_off_are_requeued_here_and_metered_until_they_stopped(user, node, base_image):
    job = running_instance(user, node, base_image, kind="job", command=["sleep", "600"])
    fence = SelfFence(node.name, AgentClock())
    cut_off(fence, 3)
    fence.check()
    time.sleep(1.5)  # contact comes back a while after the stop: the meter must end at the stop, not now

    fence.contact()
    assert fence.report() == [job.pk]

    job.refresh_from_db()
    assert job.status == WorkloadStatus.QUEUED and "lost contact with the control plane" in job.status_reason
    assert job.pinned_node_id == node.pk and job.preemptions == 1  # resumes from its checkpoint volume here
    segment = MeterSegment.objects.get(workload=job)
    stopped_at = job.events.get(to_status=WorkloadStatus.QUEUED, from_status=WorkloadStatus.RUNNING).created_at
    assert segment.ended_at == stopped_at
    assert (job.status_changed_at - segment.started_at).total_seconds() < 3  # not the extra 1.5 s
    assert fence.pending() == {}


def test_a_reconcile_after_contact_returns_does_not_read_a_fenced_job_as_crashed(user, node, base_image):
    job = running_instance(user, node, base_image, kind="job", command=["sleep", "600"])
    fence = SelfFence(node.name, AgentClock())
    cut_off(fence, 3)
    fence.check()

    agent_reconcile(node.name)  # e.g. the Docker-events watcher, first to reach the database again

    job.refresh_from_db()
    assert job.status == WorkloadStatus.QUEUED, job.status_reason


def test_a_job_the_control_plane_already_requeued_is_left_as_it_is(user, node, base_image):
    from scheduler.services.lifecycle import workload_transition

    job = running_instance(user, node, base_image, kind="job", command=["sleep", "600"])
    fence = SelfFence(node.name, AgentClock())
    cut_off(fence, 3)
    fence.check()
    assert workload_transition(
        job, to=WorkloadStatus.QUEUED, allowed_from=[WorkloadStatus.RUNNING], reason="requeued: node lost"
    )

    assert fence.report() == []
    job.refresh_from_db()
    assert job.status_reason == "requeued: node lost" and fence.pending() == {}


def test_a_job_already_running_on_another_node_is_left_as_it_is(user, node, base_image):
    from scheduler.models import Workload

    job = running_instance(user, node, base_image, kind="job", command=["sleep", "600"])
    fence = SelfFence(node.name, AgentClock())
    cut_off(fence, 3)
    fence.check()
    elsewhere = make_node("sim:1xRTX3090")
    Workload.objects.filter(pk=job.pk).update(node=elsewhere)  # requeued and placed there meanwhile

    assert fence.report() == []
    job.refresh_from_db()
    assert job.status == WorkloadStatus.RUNNING and job.node == elsewhere
