"""Files through the portal: upload into the real container's data disk, list, download; traversal and size refused."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from portal.models import Instance
from scheduler.node.launcher import docker_client
from tests.conftest import wait_status
from tests.portal.test_instance_api import create

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def running(api, catalog, node_worker, user):
    assert create(api, catalog).status_code == 201
    instance = Instance.objects.get()
    wait_status(instance.workload, "running", timeout=30)
    console = Client(enforce_csrf_checks=False)
    console.force_login(user)
    return instance, console


def messages_of(response) -> str:
    return " ".join(str(m) for m in response.context["messages"]) if response.context else ""


def test_a_file_uploaded_lands_in_the_container_and_comes_back_down(running):
    instance, console = running
    base = f"/instances/{instance.pk}/files/"
    body = b"weights " * 1000
    upload = SimpleUploadedFile("model.bin", body)
    assert console.post(f"{base}upload/", {"dir": "/root/autodl-tmp", "file": upload}).status_code == 302
    container = docker_client().containers.get(instance.workload.container_name)
    assert container.exec_run(["cat", "/root/autodl-tmp/model.bin"]).output == body
    page = console.get(base).content.decode()
    assert 'data-entry="model.bin"' in page and "7.8\xa0KB" in page
    download = console.get(f"{base}download/", {"path": "/root/autodl-tmp/model.bin"})
    assert download.status_code == 200 and b"".join(download.streaming_content) == body
    assert 'filename="model.bin"' in download["Content-Disposition"]


def test_paths_outside_the_disks_and_oversized_files_are_refused(running, settings):
    instance, console = running
    base = f"/instances/{instance.pk}/files/"
    page = console.get(base, {"path": "/root/autodl-tmp/../../etc"}).content.decode()
    assert "data-error" in page and "outside /root" in page
    escaped = console.get(f"{base}download/", {"path": "/root/autodl-tmp/../../etc/passwd"}, follow=True)
    assert "outside" in messages_of(escaped)
    wrong = console.post(f"{base}upload/", {"dir": "/etc", "file": SimpleUploadedFile("x", b"x")}, follow=True)
    assert "outside" in messages_of(wrong)
    settings.FILE_TRANSFER_MAX_MB = 1
    big = console.post(
        f"{base}upload/", {"dir": "/root/autodl-tmp", "file": SimpleUploadedFile("big", b"0" * (2 << 20))}, follow=True
    )
    assert "limited to 1 MB" in messages_of(big)
    container = docker_client().containers.get(instance.workload.container_name)
    assert container.exec_run(["ls", "/root/autodl-tmp"]).output.decode().split() == []


def test_an_outsider_gets_404(running, outsider):
    instance, _ = running
    other = Client()
    other.force_login(outsider)
    assert other.get(f"/instances/{instance.pk}/files/").status_code == 404
    assert other.get(f"/instances/{instance.pk}/files/download/", {"path": "/root/autodl-tmp/x"}).status_code == 404


def test_an_upload_without_the_csrf_token_is_refused(running, user):
    instance, _ = running
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    response = strict.post(f"/instances/{instance.pk}/files/upload/", {"file": SimpleUploadedFile("x", b"x")})
    assert response.status_code == 403
