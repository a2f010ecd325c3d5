"""Nodes: registration, heartbeats on the database's clock, and losing a silent node."""

from datetime import timedelta

import pytest
from django.utils import timezone

from agent.gpus import simulated_inventory
from billing.metering import meter_reconcile, running_intervals
from billing.models import MeterSegment
from core.clock import db_now
from scheduler.models import ClusterWatch, Gpu, MeterChange, Node, NodeStatus, WorkloadStatus
from scheduler.services.allocation import Share, allocation_create
from scheduler.services.lifecycle import workload_transition
from scheduler.services.node_loss import nodes_mark_lost
from scheduler.services.nodes import node_heartbeat, node_register, node_rejoin
from scheduler.services.workloads import workload_release, workload_stop
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


def test_registering_again_updates_the_node_without_duplicating_cards():
    node = make_node("sim:2xRTX3090")
    again = node_register(
        name=node.name,
        hostname="h2",
        cpu_cores=16,
        memory_mb=1024,
        gpus=simulated_inventory("sim:2xRTX3090", node.name),
        simulated=True,
        nvidia_runtime=False,
    )
    assert again.pk == node.pk and again.cpu_cores == 16
    assert Gpu.objects.filter(node=node).count() == 2


def watched_for(seconds: int) -> None:
    """The control plane has been looking at the heartbeats, without a gap, for ``seconds``."""
    now = db_now()
    ClusterWatch.objects.update_or_create(
        pk=1, defaults=dict(checked_at=now, watching_since=now - timedelta(seconds=seconds))
    )


def lose(node):
    watched_for(600)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=db_now() - timedelta(minutes=5))
    assert nodes_mark_lost(silent_for=timedelta(seconds=30)) == [node.name]


def place(w, node):
    card = node.gpus.get()
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    return card


def running(w, node, on_commit):
    place(w, node)
    with on_commit(execute=True):  # metering opens after commit
        assert workload_transition(w, to=WorkloadStatus.RUNNING, allowed_from=[WorkloadStatus.STARTING])
    return w


def test_a_lost_nodes_running_instance_goes_on_running_there_uncharged_until_the_node_is_heard_again(
    user, django_capture_on_commit_callbacks
):
    node = make_node("sim:1xRTX3090")
    w = running(workload(user), node, django_capture_on_commit_callbacks)
    began = db_now() - timedelta(minutes=20)  # it has run 20 minutes; the host's last heartbeat: 5 minutes ago
    w.events.update(created_at=began)
    MeterSegment.objects.filter(workload=w).update(started_at=began)

    with django_capture_on_commit_callbacks(execute=True):
        lose(node)

    w.refresh_from_db()
    assert w.status == WorkloadStatus.RUNNING  # the host runs it still; it is re-adopted when heard again
    assert node.gpus.get().allocated_milli == 1000
    node.refresh_from_db()
    [charged] = MeterSegment.objects.filter(workload=w)
    assert (charged.started_at, charged.ended_at) == (began, node.last_heartbeat)  # not a second past it
    pause = w.events.get(meter=MeterChange.PAUSE)
    assert pause.created_at == node.last_heartbeat and "not charged" in pause.reason

    with django_capture_on_commit_callbacks(execute=True):
        assert node_rejoin(name=node.name, epoch=node.epoch)

    first, again = MeterSegment.objects.filter(workload=w).order_by("started_at")
    resume = w.events.get(meter=MeterChange.RESUME)
    assert first == charged and (again.started_at, again.ended_at) == (resume.created_at, None)
    assert resume.created_at - pause.created_at >= timedelta(minutes=5)  # the unreachable time is not charged
    # The event history says the same: rebuilding the segments from it changes nothing.
    assert meter_reconcile(since=began - timedelta(minutes=1)) == 0
    segments = [(s.started_at, s.ended_at) for s in MeterSegment.objects.filter(workload=w).order_by("started_at")]
    assert segments == [(start, end) for start, end, _ in running_intervals(w.events.all())]


def test_a_rejoin_charges_nothing_its_owner_stopped_meanwhile(user, django_capture_on_commit_callbacks):
    node = make_node("sim:1xRTX3090")
    w = running(workload(user), node, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        lose(node)
        workload_stop(w, reason="stop requested")
        assert node_rejoin(name=node.name, epoch=node.epoch)
    assert list(w.events.exclude(meter="").values_list("meter", flat=True)) == [MeterChange.PAUSE]
    assert MeterSegment.objects.get(workload=w).ended_at is not None


def test_a_stop_of_an_instance_on_an_unreachable_node_ends_its_meter_at_once(user, django_capture_on_commit_callbacks):
    node = make_node("sim:1xRTX3090")
    w = running(workload(user), node, django_capture_on_commit_callbacks)
    lose(node)

    with django_capture_on_commit_callbacks(execute=True):
        workload_stop(w, reason="stop requested")

    w.refresh_from_db()
    assert w.status == WorkloadStatus.STOPPED and "unreachable" in w.status_reason
    assert MeterSegment.objects.get(workload=w).ended_at is not None  # at the loss, and it stays stopped
    assert node.gpus.get().allocated_milli == 0


def test_an_instance_still_starting_on_a_lost_node_fails_and_frees_its_card(user):
    node = make_node("sim:1xRTX3090")
    w = workload(user)
    card = place(w, node)

    lose(node)

    w.refresh_from_db()
    card.refresh_from_db()
    assert w.status == WorkloadStatus.FAILED and "stopped sending heartbeats" in w.status_reason
    assert card.allocated_milli == 0


def test_a_control_plane_back_from_an_outage_watches_afresh_before_it_declares_a_node_lost():
    node = make_node("sim:1xT4")
    silent = timedelta(seconds=30)
    # The control plane last looked 10 minutes ago (the database, Redis or the worker was down), and the
    # node's last heartbeat is from before the outage: no node is lost the moment it returns.
    ClusterWatch.objects.update_or_create(
        pk=1, defaults=dict(checked_at=db_now() - timedelta(minutes=10), watching_since=db_now() - timedelta(hours=1))
    )
    Node.objects.filter(pk=node.pk).update(last_heartbeat=db_now() - timedelta(minutes=11))

    assert nodes_mark_lost(silent_for=silent) == []
    assert ClusterWatch.objects.get().watching_since > db_now() - timedelta(seconds=5)

    watched_for(31)  # it has now watched the node stay silent for longer than the limit
    assert nodes_mark_lost(silent_for=silent) == [node.name]


def test_heartbeats_carry_the_databases_time_not_the_agents(monkeypatch):
    node = make_node("sim:1xT4")
    monkeypatch.setattr(timezone, "now", lambda: db_now() - timedelta(seconds=40))  # this host's clock is 40 s late

    node_heartbeat(name=node.name, epoch=node.epoch)

    node.refresh_from_db()
    assert abs((node.last_heartbeat - db_now()).total_seconds()) < 5
    watched_for(600)
    assert nodes_mark_lost(silent_for=timedelta(seconds=30)) == []


def test_a_lost_nodes_jobs_are_requeued_to_run_anywhere(user):
    node = make_node("sim:1xRTX3090")
    job = workload(user, kind="job", preemptible=True)
    place(job, node)

    lose(node)

    job.refresh_from_db()
    node.refresh_from_db()
    assert job.status == WorkloadStatus.QUEUED and "requeued" in job.status_reason
    assert job.node is None and job.pinned_node is None
    assert node.allocated_cpu == 0 and node.allocated_memory_mb == 0  # given back to the node it held them on
    assert job.preemptions == 1  # its command sees GPUCLOUD_RESUME_COUNT=1


def test_releasing_work_on_a_lost_node_does_not_hang(user):
    node = make_node("sim:1xRTX3090")
    stopped = workload(user, status=WorkloadStatus.STOPPED, node=node)
    releasing = workload(user, status=WorkloadStatus.RELEASING, node=node)

    lose(node)
    releasing.refresh_from_db()
    assert releasing.status == WorkloadStatus.RELEASED

    workload_release(stopped)  # asked while the node is away: done at once, no task that would wait for it
    stopped.refresh_from_db()
    assert stopped.status == WorkloadStatus.RELEASED and node.name in stopped.status_reason


def test_a_heartbeat_keeps_a_node_but_does_not_revive_a_lost_one_before_it_fences():
    node = make_node("sim:1xT4")
    watched_for(600)
    assert nodes_mark_lost(silent_for=timedelta(seconds=30)) == []
    Node.objects.filter(pk=node.pk).update(status=NodeStatus.LOST)

    assert node_heartbeat(name=node.name, epoch=node.epoch) == NodeStatus.LOST
    assert node_rejoin(name=node.name, epoch=node.epoch)
    node.refresh_from_db()
    assert node.status == NodeStatus.ACTIVE


def test_each_agent_start_is_a_new_epoch_and_the_old_agents_heartbeats_are_refused():
    node = make_node("sim:1xT4")
    old_epoch = node.epoch
    again = make_node_again(node)
    assert again.epoch == old_epoch + 1
    assert node_heartbeat(name=node.name, epoch=old_epoch) is None
    assert node_heartbeat(name=node.name, epoch=again.epoch) == NodeStatus.ACTIVE


def make_node_again(node):
    return node_register(
        name=node.name,
        hostname="h",
        cpu_cores=node.cpu_cores,
        memory_mb=node.memory_mb,
        gpus=simulated_inventory("sim:1xT4", node.name),
        simulated=True,
        nvidia_runtime=False,
    )
