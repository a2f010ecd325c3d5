"""Save as image: a stopped instance's system disk committed on its node, reused by new instances, then deleted."""

import docker
import pytest
from django.test import Client

from agent.launcher import docker_client
from portal.models import Image, Instance
from tests.conftest import wait_for, wait_status
from tests.portal.test_instance_api import container, create

pytestmark = pytest.mark.django_db(transaction=True)


def image_status(image_id: int, status: str, timeout: float = 60) -> Image:
    def reached():
        image = Image.objects.get(pk=image_id)
        return image if image.status == status else None

    return wait_for(reached, timeout=timeout, what=f"image {image_id} {status}")


@pytest.fixture
def stopped(api, catalog, node_worker):
    """A running instance with a file on its system disk and one on its data disk, then stopped."""
    assert create(api, catalog).status_code == 201
    instance = Instance.objects.get()
    wait_status(instance.workload, "running")
    c = container(instance)
    assert (
        c.exec_run(["sh", "-c", "echo kept > /root/kept.txt && echo data > /root/autodl-tmp/data.txt"]).exit_code == 0
    )
    assert api.post(f"/api/v1/instances/{instance.pk}/stop/").status_code == 202
    wait_status(instance.workload, "stopped")
    return instance


def test_a_saved_image_carries_the_system_disk_to_a_new_instance_on_the_same_node(api, catalog, stopped):
    response = api.post(f"/api/v1/instances/{stopped.pk}/save-image/", {"name": "my-env"}, format="json")
    assert response.status_code == 202, response.data
    assert response.data["status"] == "saving" and response.data["visibility"] == "private"
    image = image_status(response.data["id"], "ready")
    assert image.size_bytes > 0 and image.node == stopped.workload.node
    assert docker_client().images.get(image.docker_ref).attrs["Size"] == image.size_bytes
    listed = api.get("/api/v1/images/").data["results"]
    assert image.pk in [i["id"] for i in listed]

    # A whole card from an image saved from a half card: the fraction's MPS caps do not come along.
    second = create(api, catalog, name="from-image", image=image.pk, gpus="1")
    assert second.status_code == 201, second.data
    clone = Instance.objects.get(pk=second.data["id"])
    assert clone.workload.pinned_node == image.node
    wait_status(clone.workload, "running")
    c = container(clone)
    assert c.exec_run(["cat", "/root/kept.txt"]).output == b"kept\n"
    assert c.exec_run(["ls", "/root/autodl-tmp"]).output == b""  # the data disk is not part of an image
    env = dict(e.split("=", 1) for e in c.attrs["Config"]["Env"])
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    assert env["GPUCLOUD_WORKLOAD_ID"] == str(clone.workload.pk)

    refused = api.delete(f"/api/v1/images/{image.pk}/")
    assert refused.status_code == 409 and "from-image" in refused.data["detail"]
    assert api.post(f"/api/v1/instances/{clone.pk}/stop/").status_code == 202
    wait_status(clone.workload, "stopped")
    assert api.post(f"/api/v1/instances/{clone.pk}/release/").status_code == 202
    wait_status(clone.workload, "released")
    assert api.delete(f"/api/v1/images/{image.pk}/").status_code == 202
    image_status(image.pk, "deleted")
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client().images.get(image.docker_ref)
    assert image.pk not in [i["id"] for i in api.get("/api/v1/images/").data["results"]]
    assert api.get("/api/v1/images/?mine=1").data["results"] == []


def test_saving_is_refused_while_running_unnamed_or_over_the_limit_and_blocks_start(api, catalog, stopped, settings):
    path = f"/api/v1/instances/{stopped.pk}/save-image/"
    unnamed = api.post(path, {"name": ""}, format="json")
    assert unnamed.status_code == 400 and "name" in unnamed.data
    settings.MAX_SAVED_IMAGES = 0
    assert api.post(path, {"name": "x"}, format="json").status_code == 429
    settings.MAX_SAVED_IMAGES = 10
    Image.objects.create(
        name="pending", framework="x", framework_version="1", cuda_version="12", docker_ref="gpucloud-saved:pending",
        visibility="private", owner=stopped.owner, status="saving", node=stopped.workload.pinned_node,
        source_instance=stopped,
    )  # fmt: skip
    started = api.post(f"/api/v1/instances/{stopped.pk}/start/")
    assert started.status_code == 409 and "being saved" in started.data["detail"]
    assert api.post(path, {"name": "again"}, format="json").status_code == 409
    Image.objects.filter(name="pending").delete()
    assert api.post(f"/api/v1/instances/{stopped.pk}/start/").status_code == 202
    wait_status(stopped.workload, "running")
    running = api.post(path, {"name": "live"}, format="json")
    assert running.status_code == 409 and "stop the instance" in running.data["detail"]


def test_a_disk_gone_from_its_node_fails_the_image_with_the_reason(api, stopped):
    container(stopped).remove(force=True)
    response = api.post(f"/api/v1/instances/{stopped.pk}/save-image/", {"name": "lost"}, format="json")
    image = image_status(response.data["id"], "failed")
    assert "disk is gone" in image.status_reason
    assert api.delete(f"/api/v1/images/{image.pk}/").status_code == 202
    assert Image.objects.get(pk=image.pk).status == "deleted"


def test_images_are_private_to_their_owner(api, outsider_api, outsider, stopped):
    response = api.post(f"/api/v1/instances/{stopped.pk}/save-image/", {"name": "mine"}, format="json")
    image = image_status(response.data["id"], "ready")
    assert outsider_api.get(f"/api/v1/images/{image.pk}/").status_code == 404
    assert outsider_api.delete(f"/api/v1/images/{image.pk}/").status_code == 404
    assert image.pk not in [i["id"] for i in outsider_api.get("/api/v1/images/").data["results"]]
    assert outsider_api.post(f"/api/v1/instances/{stopped.pk}/save-image/", {"name": "x"}).status_code == 404
    console = Client()
    console.force_login(outsider)
    assert console.post(f"/images/{image.pk}/delete/").status_code == 404
    assert console.post(f"/instances/{stopped.pk}/save-image/", {"name": "x"}).status_code == 404
    assert image.pk not in [c[0] for g in console.get("/instances/new/").context["form"].fields["image"].choices
                            for c in g[1]]  # fmt: skip
    assert Image.objects.get(pk=image.pk).status == "ready"
