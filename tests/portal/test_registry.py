"""The image registry: catalog and saved images pushed once and pulled by any host, deleted there, refused readably.

A real registry (Debian's docker-registry, htpasswd authentication) runs on a free
loopback port for this module; the root Docker engine pushes to it and pulls from it.
"Another host" is a second node row served by the same engine: what it proves is that
nothing pins the work to the node that saved the image, and that the launch pulls it.
"""

import io
import shutil
import subprocess
from pathlib import Path

import docker
import pytest
import requests
from django.conf import settings
from django.core.management import call_command

from agent.launcher import docker_client
from portal.models import GpuType, Image, Instance
from portal.services.demo import catalog_load, stand_in_load
from scheduler.registry import MANIFEST_TYPES, image_name, manifest_digest, registry_ref
from tests.conftest import TEST_IMAGE, make_node, remove_node_containers, wait_for, wait_status, worker_for
from tests.portal.test_instance_api import container, create
from tests.portal.test_saved_images import image_status
from tests.ports import free_port

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = Path(__file__).resolve().parents[2] / "config" / "dev" / "registry.sh"
USERNAME, PASSWORD = "gpucloud", "registry-test-pass"


class RegistryServer:
    def __init__(self, folder: Path, *, tls: bool = False, env: dict | None = None):
        for tool, package in (("docker-registry", "docker-registry"), ("htpasswd", "apache2-utils")):
            if shutil.which(tool) is None:
                pytest.fail(f"{tool} is missing: apt-get install {package} (make test installs it)")
        self.address = f"127.0.0.1:{free_port()}"
        self.folder = folder
        given = env or {}
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "REGISTRY_USERNAME": USERNAME, "REGISTRY_PASSWORD": PASSWORD}
        env |= given
        if tls:
            env["REGISTRY_TLS_NAMES"] = "127.0.0.1"
        subprocess.run(["bash", str(SCRIPT), "write", str(folder), self.address], env=env, check=True)
        self.log = open(folder / "registry.log", "wb")
        self.process = subprocess.Popen(
            ["bash", str(SCRIPT), "serve", str(folder)], env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.url = f"{'https' if tls else 'http'}://{self.address}/v2/"
        self.ca = str(folder / "ca.crt") if tls else None
        wait_for(self._answers, timeout=15, what=f"the registry on {self.address}")

    def _answers(self) -> bool:
        assert self.process.poll() is None, (self.folder / "registry.log").read_text()
        try:
            return requests.get(self.url, verify=self.ca or True, timeout=2).status_code == 401
        except requests.ConnectionError:
            return False

    def manifest_status(self, ref: str) -> int:
        name = image_name(ref)
        return requests.head(
            f"{self.url}{name.repository}/manifests/{name.tag}",
            auth=(USERNAME, PASSWORD),
            headers={"Accept": MANIFEST_TYPES},
            verify=self.ca or True,
            timeout=10,
        ).status_code

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        self.log.close()
        client = docker_client()
        for image in client.images.list():
            for tag in image.tags:
                if tag.startswith(f"{self.address}/"):
                    client.images.remove(tag, force=True)


@pytest.fixture(scope="module")
def registry_server(tmp_path_factory):
    server = RegistryServer(tmp_path_factory.mktemp("registry"))
    yield server
    server.stop()


@pytest.fixture
def registry(registry_server, settings):
    settings.REGISTRY = registry_server.address
    settings.REGISTRY_USERNAME = USERNAME
    settings.REGISTRY_PASSWORD = PASSWORD
    return registry_server


@pytest.fixture
def registry_catalog(registry, base_image):
    """The demo catalog with its references in the registry, pushed there by build_images."""
    catalog_load()
    stand_in_load()
    call_command("build_images", "--only", TEST_IMAGE, stdout=io.StringIO())
    return {
        "rtx3090": GpuType.objects.get(name="RTX3090"),
        "h100": GpuType.objects.get(name="H100"),
        "image": Image.objects.get(docker_ref=registry_ref(TEST_IMAGE)),
    }


@pytest.fixture
def two_hosts(transactional_db, sim_node, base_image):
    """A real Celery worker serving the scheduler queue and the queues of two nodes (the second has an H100)."""
    other = make_node("sim:1xH100")
    with worker_for(sim_node, other):
        yield sim_node, other
    remove_node_containers(other.name)


def local_copy_removed(ref: str) -> None:
    try:
        docker_client().images.remove(ref, force=True)
    except docker.errors.ImageNotFound:
        pass
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client().images.get(ref)


def test_image_names_are_split_as_docker_splits_them():
    assert image_name("127.0.0.1:5000/gpucloud/pytorch:2.5.1-cuda12.4").path == "127.0.0.1:5000/gpucloud/pytorch"
    assert image_name("127.0.0.1:5000/gpucloud/pytorch:2.5.1-cuda12.4").tag == "2.5.1-cuda12.4"
    assert image_name("registry.example/saved").tag == "latest"
    assert image_name("gpucloud/pytorch:2.5.1").registry == ""
    assert image_name("gpucloud-saved:dev-7").repository == "gpucloud-saved"
    assert image_name("localhost/x:1").registry == "localhost"


def test_catalog_images_are_pushed_once_and_pulled_by_a_host_that_lacks_them(
    api, registry, registry_catalog, two_hosts
):
    ref = registry_catalog["image"].docker_ref
    assert ref == f"{registry.address}/{TEST_IMAGE}" and registry.manifest_status(ref) == 200
    out = io.StringIO()
    call_command("build_images", "--only", TEST_IMAGE, stdout=out)  # a second run pushes nothing: it is there
    assert "pushed" not in out.getvalue() and f"{ref} is in the registry already" in out.getvalue()

    local_copy_removed(ref)
    response = create(api, registry_catalog)
    assert response.status_code == 201, response.data
    instance = Instance.objects.get(pk=response.data["id"])
    wait_status(instance.workload, "running")
    assert container(instance).attrs["Config"]["Image"] == ref
    assert docker_client().images.get(ref)


def test_a_wrong_registry_password_fails_the_launch_saying_why(api, registry, registry_catalog, node_worker, settings):
    ref = registry_catalog["image"].docker_ref
    local_copy_removed(ref)
    settings.REGISTRY_PASSWORD = "not-the-password"
    response = create(api, registry_catalog)
    assert response.status_code == 201, response.data
    workload = Instance.objects.get(pk=response.data["id"]).workload
    wait_status(workload, "failed")
    assert workload.status_reason.startswith(f"cannot pull image {ref} from the registry {registry.address}: ")
    assert "unauthorized" in workload.status_reason


def test_a_saved_image_starts_on_another_host_and_deleting_it_removes_it_from_the_registry(
    api, outsider_api, registry, registry_catalog, two_hosts
):
    first, second = two_hosts
    assert create(api, registry_catalog).status_code == 201
    instance = Instance.objects.get()
    wait_status(instance.workload, "running")
    assert instance.workload.node == first
    assert container(instance).exec_run(["sh", "-c", "echo kept > /root/kept.txt"]).exit_code == 0
    assert api.post(f"/api/v1/instances/{instance.pk}/stop/").status_code == 202
    wait_status(instance.workload, "stopped")

    saved = api.post(f"/api/v1/instances/{instance.pk}/save-image/", {"name": "my-env"}, format="json")
    assert saved.status_code == 202, saved.data
    image = image_status(saved.data["id"], "ready")
    repository = f"gpucloud-saved/u{instance.owner_id}-i{image.pk}"  # its own: a host's push grant is one image
    assert image.docker_ref == f"{registry.address}/{repository}:{settings.DEPLOYMENT_ID}-{image.pk}"
    assert image.node is None and image.size_bytes > 0
    assert registry.manifest_status(image.docker_ref) == 200

    # The outsider neither sees it nor starts work from it.
    assert outsider_api.get(f"/api/v1/images/{image.pk}/").status_code == 404
    refused = create(outsider_api, registry_catalog, image=image.pk)
    assert refused.status_code == 400 and "image" in refused.data

    # Pulled by a host that does not have it, on another node than the one that saved it.
    local_copy_removed(image.docker_ref)
    response = create(api, registry_catalog, name="elsewhere", image=image.pk, gpu_type=registry_catalog["h100"].pk)
    assert response.status_code == 201, response.data
    clone = Instance.objects.get(pk=response.data["id"])
    assert clone.workload.pinned_node is None
    wait_status(clone.workload, "running")
    assert clone.workload.node == second
    assert container(clone).exec_run(["cat", "/root/kept.txt"]).output == b"kept\n"

    assert api.post(f"/api/v1/instances/{clone.pk}/stop/").status_code == 202
    wait_status(clone.workload, "stopped")
    assert api.post(f"/api/v1/instances/{clone.pk}/release/").status_code == 202
    wait_status(clone.workload, "released")
    assert outsider_api.delete(f"/api/v1/images/{image.pk}/").status_code == 404
    assert api.delete(f"/api/v1/images/{image.pk}/").status_code == 202
    image_status(image.pk, "deleted")
    assert registry.manifest_status(image.docker_ref) == 404
    assert manifest_digest(image_name(image.docker_ref)) is None

    def gone_from_the_engine():
        try:
            docker_client().images.get(image.docker_ref)
        except docker.errors.ImageNotFound:
            return True
        return False

    wait_for(gone_from_the_engine, timeout=30, what="the hosts to drop their copy")


def test_a_registry_that_cannot_be_reached_keeps_the_image_with_the_reason(user, registry, settings):
    image = Image.objects.create(
        name="orphan", framework="x", framework_version="1", cuda_version="12", visibility="private", owner=user,
        docker_ref=f"127.0.0.1:{free_port()}/gpucloud-saved:{settings.DEPLOYMENT_ID}-0", status="deleting",
    )  # fmt: skip
    from portal.services.images import image_delete_from_registry

    image_delete_from_registry(image.pk)
    image.refresh_from_db()
    assert image.status == "ready" and "cannot be reached" in image.status_reason


def test_the_registry_serves_tls_with_its_own_ca_and_the_control_plane_verifies_it(tmp_path, settings, base_image):
    server = RegistryServer(tmp_path, tls=True)
    try:
        settings.REGISTRY, settings.REGISTRY_USERNAME, settings.REGISTRY_PASSWORD = server.address, USERNAME, PASSWORD
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(server.url, timeout=5)  # not a certificate anyone trusts but who holds its CA
        ref = f"{server.address}/gpucloud/busybox-standin:tls"
        docker_client().images.get(base_image).tag(f"{server.address}/gpucloud/busybox-standin", "tls")
        from agent.launcher import image_push

        image_push(ref)
        settings.REGISTRY_CA_FILE = server.ca
        assert manifest_digest(image_name(ref)).startswith("sha256:")
    finally:
        server.stop()
