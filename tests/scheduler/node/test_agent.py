"""The node agent against the real Docker engine: what it promises and what it refuses."""

import os

import pytest

from scheduler.models import WorkloadStatus
from scheduler.node import launcher
from scheduler.node.agent import agent_launch, agent_reconcile, agent_register
from scheduler.services.allocation import Share, allocation_create
from tests.conftest import make_node, remove_node_containers
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


def test_a_node_never_advertises_more_cpus_or_memory_than_its_host_has(settings):
    settings.GPU_BACKEND = "sim:1xT4"
    settings.NODE_CPUS = 100 * (os.cpu_count() or 1)
    settings.NODE_MEMORY_MB = 1 << 30
    node = agent_register("test-oversold")
    assert node.cpu_cores == os.cpu_count()
    assert node.memory_mb == launcher.docker_client().info()["MemTotal"] // (1024 * 1024)


def test_work_asking_more_cores_than_the_host_has_fails_to_start_instead_of_being_capped(user, base_image):
    node = make_node("sim:1xRTX3090", cpu_cores=1024)
    card = node.gpus.get()
    cores = (os.cpu_count() or 1) + 2
    w = workload(user, cpu=cores, image_ref=base_image)
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    try:
        agent_launch(w.pk)
        w.refresh_from_db()
        assert w.status == WorkloadStatus.FAILED
        assert f"asks for {cores} CPU cores" in w.status_reason
        assert launcher.containers_on_node(node.name) == {}
    finally:
        remove_node_containers(node.name)


def test_shared_volumes_and_reconciliation_are_per_deployment(user, base_image, settings):
    node = make_node("sim:1xRTX3090")
    mine = launcher.shared_volume_name(user.pk)
    settings.DEPLOYMENT_ID = "other-deployment"
    assert launcher.shared_volume_name(user.pk) != mine
    # Another deployment's container on the same engine and node name is not ours to remove.
    labels = {
        f"{launcher.LABEL}.node": node.name,
        f"{launcher.LABEL}.deployment": "other-deployment",
        f"{launcher.LABEL}.uid": "0123456789ab",
    }
    other = launcher.docker_client().containers.create(base_image, ["true"], labels=labels, network_mode="none")
    try:
        settings.DEPLOYMENT_ID = "test-this-one"
        agent_reconcile(node.name)
        other.reload()  # raises NotFound if reconciliation removed it
    finally:
        other.remove(force=True)
        remove_node_containers(node.name)
