"""Instances through the REST API, on a real worker, Redis and Docker."""

import os
from decimal import Decimal

import docker
import pytest
from django.conf import settings
from rest_framework.test import APIClient

from agent.launcher import LABEL, docker_client
from portal.models import Instance
from scheduler.models import Node, Workload
from tests.conftest import wait_status


def create(api, catalog, **overrides):
    body = {
        "name": "train",
        "image": catalog["image"].pk,
        "gpu_type": catalog["rtx3090"].pk,
        "gpus": "0.5",
        "cpu_cores": 2,
        "memory_gb": 1,
        "disk_gb": 20,
    }
    body.update(overrides)
    return api.post("/api/v1/instances/", body, format="json")


def container(instance):
    return docker_client().containers.get(instance.workload.container_name)


@pytest.mark.django_db(transaction=True)
def test_an_instance_runs_as_a_real_container_and_keeps_its_data_across_stop_and_start(api, catalog, node_worker):
    response = create(api, catalog)
    assert response.status_code == 201, response.data
    instance = Instance.objects.get(pk=response.data["id"])
    wait_status(instance.workload, "running")

    c = container(instance)
    host = c.attrs["HostConfig"]
    assert host["NanoCpus"] == min(2, os.cpu_count()) * 10**9  # capped at the host's cores
    assert host["Memory"] == 1024 * 1024 * 1024
    assert host["PidsLimit"] > 0
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["CapDrop"] == ["ALL"]
    assert c.labels["gpucloud.workload"] == str(instance.workload.pk)
    assert c.labels["gpucloud.owner"] == str(instance.owner_id)
    assert c.labels["gpucloud.node"] == node_worker.name
    env = dict(line.split("=", 1) for line in c.attrs["Config"]["Env"])
    card = instance.workload.allocations.get().gpu
    assert env["NVIDIA_VISIBLE_DEVICES"] == card.uuid
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={card.memory_mb // 2}M"
    assert env["GPUCLOUD_GPU_SIMULATED"] == "1"
    mounts = {m["Destination"]: m for m in c.attrs["Mounts"]}
    assert mounts["/root/autodl-tmp"]["Name"] == instance.workload.volume_name
    assert c.exec_run(["sh", "-c", "echo weights > /root/autodl-tmp/ckpt && echo sys > /root/notes"]).exit_code == 0

    assert api.post(f"/api/v1/instances/{instance.pk}/stop/").status_code == 202
    wait_status(instance.workload, "stopped")
    assert container(instance).status == "exited"
    docker_client().volumes.get(instance.workload.volume_name)  # the data volume stays
    card.refresh_from_db()
    assert card.allocated_milli == 0

    assert api.post(f"/api/v1/instances/{instance.pk}/start/").status_code == 202
    wait_status(instance.workload, "running")
    out = container(instance).exec_run(["cat", "/root/autodl-tmp/ckpt", "/root/notes"]).output.decode()
    assert out.split() == ["weights", "sys"]

    assert api.post(f"/api/v1/instances/{instance.pk}/release/").status_code == 409  # stop first
    api.post(f"/api/v1/instances/{instance.pk}/stop/")
    wait_status(instance.workload, "stopped")
    assert api.post(f"/api/v1/instances/{instance.pk}/release/").status_code == 202
    wait_status(instance.workload, "released")
    with pytest.raises(docker.errors.NotFound):
        container(instance)
    with pytest.raises(docker.errors.NotFound):
        docker_client().volumes.get(instance.workload.volume_name)


@pytest.mark.django_db(transaction=True)
def test_a_container_killed_from_outside_is_noticed_by_reconciliation(api, catalog, node_worker):
    from scheduler.tasks import cluster_reconcile

    instance = Instance.objects.get(pk=create(api, catalog, gpus="1").data["id"])
    wait_status(instance.workload, "running")
    container(instance).kill()
    # Beat's task, on this session's scheduler queue: it fans out to the node's queue.
    cluster_reconcile.apply_async(queue=settings.SCHEDULER_QUEUE)
    wait_status(instance.workload, "failed")
    assert "137" in instance.workload.status_reason
    assert not instance.workload.allocations.exists()
    assert api.post(f"/api/v1/instances/{instance.pk}/start/").status_code == 202
    wait_status(instance.workload, "running")


@pytest.mark.django_db(transaction=True)
def test_an_instance_that_does_not_fit_now_waits_and_starts_when_a_card_frees(api, catalog, node_worker):
    first = Instance.objects.get(pk=create(api, catalog, gpus="2").data["id"])
    wait_status(first.workload, "running")
    second = Instance.objects.get(pk=create(api, catalog, gpus="1").data["id"])
    assert second.workload.status == "queued"
    api.post(f"/api/v1/instances/{first.pk}/stop/")
    wait_status(second.workload, "running")


BAD_INPUTS = [
    ({"gpus": "0.05"}, "gpus"),
    ({"gpus": "1.5"}, "gpus"),
    ({"gpus": "0"}, "gpus"),
    ({"gpus": "abc"}, "gpus"),
    ({"gpus": "3"}, "gpus"),  # no node has 3 RTX 3090s
    ({"gpus": "9"}, "gpus"),
    ({"image": 999999}, "image"),
    ({"gpu_type": 999999}, "gpu_type"),
    ({"gpu_type": "h100"}, "gpu_type"),  # no node has H100s
    ({"memory_gb": -1}, "memory_gb"),
    ({"memory_gb": 4000}, "memory_gb"),
    ({"cpu_cores": 0}, "cpu_cores"),
    ({"cpu_cores": 200}, "cpu_cores"),
    ({"disk_gb": -5}, "disk_gb"),
    ({"billing_mode": "free"}, "billing_mode"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("override", "field"), BAD_INPUTS)
def test_bad_input_is_refused_naming_the_field_and_leaves_nothing_behind(api, catalog, sim_node, override, field):
    if override.get("gpu_type") == "h100":
        override = {"gpu_type": catalog["h100"].pk}
    ours = {"label": f"{LABEL}.deployment={settings.DEPLOYMENT_ID}"}  # other runs' containers share the engine
    containers_before = len(docker_client().containers.list(all=True, filters=ours))
    response = create(api, catalog, **override)
    assert response.status_code == 400
    assert field in response.data, response.data
    assert not Workload.objects.exists() and not Instance.objects.exists()
    assert len(docker_client().containers.list(all=True, filters=ours)) == containers_before


@pytest.mark.django_db
def test_a_data_disk_no_host_has_room_for_is_refused_naming_the_field(api, catalog, sim_node, settings):
    settings.INSTANCE_SYSTEM_DISK_GB = 30
    Node.objects.filter(pk=sim_node.pk).update(disk_gb=130)
    response = create(api, catalog, disk_gb=101)
    assert response.status_code == 400
    assert response.data["disk_gb"] == ["no RTX3090 node has room for a 101 GB data disk (at most 100 GB)"]
    assert not Workload.objects.exists()
    assert create(api, catalog, disk_gb=100).status_code == 201


@pytest.mark.django_db
def test_an_outsider_can_neither_see_nor_touch_someone_elses_instance(api, outsider_api, catalog, sim_node):
    instance_id = create(api, catalog).data["id"]
    assert outsider_api.get("/api/v1/instances/").data["results"] == []
    assert outsider_api.get(f"/api/v1/instances/{instance_id}/").status_code == 404
    for action in ["start", "stop", "restart", "release"]:
        assert outsider_api.post(f"/api/v1/instances/{instance_id}/{action}/").status_code == 404
    assert Workload.objects.get().status == "queued"


@pytest.mark.django_db
def test_anonymous_requests_are_refused(catalog, sim_node):
    anonymous = APIClient()
    for url in ["/api/v1/instances/", "/api/v1/gpu-types/", "/api/v1/images/", "/api/v1/nodes/"]:
        assert anonymous.get(url).status_code in (401, 403)


@pytest.mark.django_db
def test_nodes_are_for_admins_only(api, admin_client, sim_node):
    assert api.get("/api/v1/nodes/").status_code == 403
    nodes = admin_client.get("/api/v1/nodes/").json()["results"]
    assert nodes[0]["simulated"] is True and len(nodes[0]["gpus"]) == 3


@pytest.mark.django_db
def test_the_catalog_shows_free_capacity_price_and_simulated(api, catalog, sim_node):
    types = {t["name"]: t for t in api.get("/api/v1/gpu-types/").data["results"]}
    assert types["RTX3090"]["capacity"]["cards"] == 2 and types["RTX3090"]["capacity"]["simulated"] is True
    assert Decimal(types["A100-80GB"]["price_per_hour"]) > Decimal(types["A100-80GB"]["spot_price_per_hour"])
    assert types["H100"]["capacity"]["cards"] == 0


@pytest.mark.django_db
def test_starting_a_queued_instance_is_a_conflict(api, catalog, sim_node):
    instance_id = create(api, catalog).data["id"]
    response = api.post(f"/api/v1/instances/{instance_id}/start/")
    assert response.status_code == 409 and "queued" in response.data["detail"]


@pytest.mark.django_db
def test_the_openapi_schema_and_docs_are_served(api):
    assert api.get("/api/schema/").status_code == 200
    assert api.get("/api/docs/").status_code == 200
