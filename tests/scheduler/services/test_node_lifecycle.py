"""An operator's node lifecycle: drain (nothing new placed, notice, stop at the deadline), activate, remove."""

from datetime import timedelta

import pytest

from core.clock import db_now
from core.errors import Conflict
from scheduler import tick
from scheduler.models import Node, NodeStatus, WorkloadStatus
from scheduler.services.allocation import Share, allocation_create
from scheduler.services.cluster import launches_resend
from scheduler.services.lifecycle import workload_transition
from scheduler.services.nodes import node_activate, node_drain, node_heartbeat, node_remove, nodes_drain_step
from scheduler.services.workloads import workload_start
from tests.conftest import make_node
from tests.scheduler.factories import workload
from tests.scheduler.services.test_nodes import make_node_again

pytestmark = pytest.mark.django_db
S = WorkloadStatus


def running(w, node):
    card = node.gpus.filter(allocated_milli=0).first()
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    assert workload_transition(w, to=S.RUNNING, allowed_from=[S.STARTING])
    return w


def test_a_draining_node_gets_no_new_work_and_its_running_instances_are_told_when_they_stop(user):
    node = make_node("sim:2xRTX3090")
    instance = running(workload(user), node)

    node_drain(node=node, notice_s=3600)

    assert node.status == NodeStatus.DRAINING
    notice = instance.events.order_by("-id").first()
    assert notice.to_status == S.RUNNING and f"node {node.name} is being drained" in notice.reason
    queued = workload(user)
    tick.schedule_tick()
    queued.refresh_from_db()
    assert queued.status == S.QUEUED  # the free card of a draining node is not used


def test_at_the_deadline_instances_are_stopped_and_jobs_requeued_and_an_empty_node_is_drained(
    user, django_capture_on_commit_callbacks
):
    node = make_node("sim:2xRTX3090")
    instance = running(workload(user), node)
    job = running(workload(user, kind="job", preemptible=True), node)
    node_drain(node=node, notice_s=3600)
    assert nodes_drain_step() == []  # before the deadline nothing is stopped
    Node.objects.filter(pk=node.pk).update(drain_deadline=db_now() - timedelta(seconds=1))

    with django_capture_on_commit_callbacks() as sent:
        nodes_drain_step()

    instance.refresh_from_db()
    job.refresh_from_db()
    assert instance.status == S.STOPPING and "drained for maintenance" in instance.status_reason
    assert job.status == S.STOPPING and job.preempt_requested
    assert len(sent) >= 2  # the stops go to the node's agent after commit
    for w in (instance, job):  # the agent has stopped them
        assert workload_transition(w, to=S.STOPPED, allowed_from=[S.STOPPING])
    assert nodes_drain_step() == [node.name]
    node.refresh_from_db()
    assert node.status == NodeStatus.DRAINED


def test_a_stopped_instance_on_a_drained_node_is_told_to_move_before_it_starts(user):
    node = make_node("sim:1xRTX3090")
    stopped = workload(user, status=S.STOPPED, node=node)
    node_drain(node=node, notice_s=0)
    nodes_drain_step()

    with pytest.raises(Conflict, match="move it to another host first"):
        workload_start(stopped)


def test_an_activated_node_takes_work_again(user):
    node = make_node("sim:1xRTX3090")
    node_drain(node=node, notice_s=60)
    node_activate(node=node)
    queued = workload(user)
    tick.schedule_tick()
    queued.refresh_from_db()
    assert queued.status == S.STARTING and queued.node_id == node.pk


def test_only_an_active_node_is_drained_and_only_a_drained_or_lost_one_removed():
    node = make_node("sim:1xT4")
    with pytest.raises(Conflict, match="drain it first"):
        node_remove(node=node)
    node_drain(node=node, notice_s=60)
    with pytest.raises(Conflict, match="only an active node"):
        node_drain(node=node, notice_s=60)


def test_removing_a_node_that_still_keeps_instance_disks_is_refused_unless_forced(user):
    node = make_node("sim:1xRTX3090")
    stopped = workload(user, status=S.STOPPED, node=node)
    node_drain(node=node, notice_s=0)
    nodes_drain_step()

    with pytest.raises(Conflict, match="move or release them first"):
        node_remove(node=node)
    node_remove(node=node, force=True)

    stopped.refresh_from_db()
    assert stopped.status == S.FAILED and "its disk went with it" in stopped.status_reason
    assert node_heartbeat(name=node.name, epoch=node.epoch) == NodeStatus.REMOVED  # its agent stops


def test_a_removed_lost_nodes_running_instance_ends_at_the_last_heartbeat(user):
    node = make_node("sim:1xRTX3090")
    instance = running(workload(user), node)
    type(instance).objects.filter(pk=instance.pk).update(status_changed_at=db_now() - timedelta(hours=1))
    last_seen = db_now() - timedelta(minutes=10)
    Node.objects.filter(pk=node.pk).update(status=NodeStatus.LOST, last_heartbeat=last_seen)

    node_remove(node=node, force=True)

    instance.refresh_from_db()
    assert instance.status == S.FAILED and instance.finished_at == last_seen
    assert instance.events.order_by("-id").first().created_at == last_seen  # its meter ends there
    assert node.gpus.get().allocated_milli == 0


def test_a_launch_left_starting_past_the_resend_time_is_sent_to_its_node_again(user, settings):
    settings.LAUNCH_RESEND_S = 30
    node = make_node("sim:2xRTX3090")
    fresh, stale = workload(user), workload(user)
    for w in (fresh, stale):
        card = node.gpus.filter(allocated_milli=0).first()
        assert allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    type(stale).objects.filter(pk=stale.pk).update(status_changed_at=db_now() - timedelta(seconds=31))

    assert launches_resend() == [stale.pk]


def test_an_agent_restart_does_not_take_a_drained_node_back_into_service():
    node = make_node("sim:1xT4")
    node_drain(node=node, notice_s=0)
    nodes_drain_step()

    again = make_node_again(node)  # its agent restarts: it registers again

    assert again.status == NodeStatus.DRAINED and again.epoch == node.epoch + 1
