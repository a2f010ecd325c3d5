"""Nodes: registration, heartbeats, and losing a silent node."""

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler.models import Gpu, Node, NodeStatus, WorkloadStatus
from scheduler.node.gpus import simulated_inventory
from scheduler.services.allocation import Share, allocation_create
from scheduler.services.nodes import node_heartbeat, node_register, node_rejoin, nodes_mark_lost
from scheduler.services.workloads import workload_release
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


def lose(node):
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=5))
    assert nodes_mark_lost(silent_for=timedelta(seconds=30)) == [node.name]


def place(w, node):
    card = node.gpus.get()
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    return card


def test_a_silent_node_is_lost_its_instance_says_so_and_its_cards_are_freed(user):
    node = make_node("sim:1xRTX3090")
    w = workload(user)
    card = place(w, node)

    lose(node)

    w.refresh_from_db()
    card.refresh_from_db()
    assert w.status == WorkloadStatus.FAILED and w.status_reason.startswith("node lost:")
    assert "start it again when the node returns" in w.status_reason
    assert card.allocated_milli == 0


def test_a_lost_nodes_jobs_are_requeued_to_run_anywhere(user):
    node = make_node("sim:1xRTX3090")
    job = workload(user, kind="job", preemptible=True)
    place(job, node)

    lose(node)

    job.refresh_from_db()
    assert job.status == WorkloadStatus.QUEUED and "requeued" in job.status_reason
    assert job.node is None and job.pinned_node is None
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
