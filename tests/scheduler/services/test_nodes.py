"""Nodes: registration, heartbeats, and losing a silent node."""

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler.models import Gpu, Node, NodeStatus, WorkloadStatus
from scheduler.node.gpus import simulated_inventory
from scheduler.services.allocation import Share, allocation_create
from scheduler.services.nodes import node_heartbeat, node_register, nodes_mark_lost
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


def test_a_silent_node_is_lost_and_its_running_work_fails_and_frees_its_cards(user):
    node = make_node("sim:1xRTX3090")
    card = node.gpus.get()
    w = workload(user)
    allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=5))

    assert nodes_mark_lost(silent_for=timedelta(seconds=30)) == [node.name]

    w.refresh_from_db()
    card.refresh_from_db()
    assert w.status == WorkloadStatus.FAILED and "lost" in w.status_reason
    assert card.allocated_milli == 0


def test_a_fresh_heartbeat_keeps_a_node_and_revives_a_lost_one():
    node = make_node("sim:1xT4")
    assert nodes_mark_lost(silent_for=timedelta(seconds=30)) == []
    Node.objects.filter(pk=node.pk).update(status=NodeStatus.LOST)
    assert node_heartbeat(name=node.name)
    node.refresh_from_db()
    assert node.status == NodeStatus.ACTIVE
