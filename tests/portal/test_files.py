"""Files through the portal and the node's relay: upload into the real container, list, download — streamed,
with traversal, links out of the tree, oversized files and too many sessions refused, and no Docker in the web tier.
"""

import hashlib
import tracemalloc

import pytest
from django.contrib.messages.storage.fallback import FallbackStorage
from django.contrib.sessions.backends.db import SessionStore
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client, RequestFactory

from agent import launcher
from agent.launcher import docker_client
from portal.console import files
from portal.models import Instance
from portal.services.relay import SessionSlot
from tests.conftest import wait_status
from tests.portal.test_instance_api import create

pytestmark = pytest.mark.django_db(transaction=True)
MB = 1024 * 1024


@pytest.fixture
def running(api, catalog, node_worker, user):
    assert create(api, catalog).status_code == 201
    instance = Instance.objects.get()
    wait_status(instance.workload, "running", timeout=30)
    console = Client(enforce_csrf_checks=False)
    console.force_login(user)
    return instance, console


def in_container(instance, *command: str) -> bytes:
    result = docker_client().containers.get(instance.workload.container_name).exec_run(list(command))
    assert result.exit_code == 0, result.output
    return result.output


def messages_of(response) -> str:
    return " ".join(str(m) for m in response.context["messages"]) if response.context else ""


def test_a_file_uploaded_lands_in_the_container_and_comes_back_down(running):
    instance, console = running
    base = f"/instances/{instance.pk}/files/"
    body = b"weights " * 1000
    upload = SimpleUploadedFile("model.bin", body)
    assert console.post(f"{base}upload/", {"dir": "/root/autodl-tmp", "file": upload}).status_code == 302
    assert in_container(instance, "cat", "/root/autodl-tmp/model.bin") == body
    page = console.get(base).content.decode()
    assert 'data-entry="model.bin"' in page and "7.8\xa0KB" in page
    download = console.get(f"{base}download/", {"path": "/root/autodl-tmp/model.bin"})
    assert download.status_code == 200 and b"".join(download.streaming_content) == body
    assert 'filename="model.bin"' in download["Content-Disposition"]


def test_paths_outside_the_disks_and_oversized_files_are_refused(running, settings):
    instance, console = running
    base = f"/instances/{instance.pk}/files/"
    page = console.get(base, {"path": "/root/autodl-tmp/../../etc"})
    assert page.status_code == 400 and "data-error" in page.content.decode()
    assert "path: &#x27;/root/autodl-tmp/../../etc&#x27; is outside /root" in page.content.decode()
    escaped = console.get(f"{base}download/", {"path": "/root/autodl-tmp/../../etc/passwd"})
    assert escaped.status_code == 400 and "outside /root" in escaped.content.decode()
    wrong = console.post(f"{base}upload/", {"dir": "/etc", "file": SimpleUploadedFile("x", b"x")}, follow=True)
    assert "outside" in messages_of(wrong)
    settings.FILE_TRANSFER_MAX_MB = 1
    big = console.post(
        f"{base}upload/", {"dir": "/root/autodl-tmp", "file": SimpleUploadedFile("big", b"0" * (2 << 20))}, follow=True
    )
    assert "limited to 1 MB" in messages_of(big)
    in_container(instance, "dd", "if=/dev/zero", "of=/root/autodl-tmp/two-mb", "bs=1M", "count=2")
    too_big = console.get(f"{base}download/", {"path": "/root/autodl-tmp/two-mb"})
    assert too_big.status_code == 400 and "at most 1 MB" in too_big.content.decode()
    assert in_container(instance, "ls", "/root/autodl-tmp").decode().split() == ["two-mb"]


def test_a_link_out_of_the_tree_is_listed_as_a_link_and_never_followed(running):
    instance, console = running
    base = f"/instances/{instance.pk}/files/"
    in_container(instance, "ln", "-s", "/etc/passwd", "/root/autodl-tmp/passwd")
    in_container(instance, "ln", "-s", "/etc", "/root/autodl-tmp/etc")
    in_container(instance, "sh", "-c", "mkdir /root/autodl-tmp/run && echo ok > /root/autodl-tmp/run/out")
    in_container(instance, "ln", "-s", "run", "/root/autodl-tmp/latest")  # inside the tree: followed

    page = console.get(base).content.decode()
    assert page.count("data-link") == 3 and "/etc/passwd" not in page
    for path in ("/root/autodl-tmp/passwd", "/root/autodl-tmp/etc/passwd"):
        refused = console.get(f"{base}download/", {"path": path})
        assert refused.status_code == 400, path
        said = refused.content.decode()
        assert "path: " in said and "is a symbolic link to /etc" in said and "not followed" in said
        assert "root:x:0:0" not in said
    listed = console.get(base, {"path": "/root/autodl-tmp/etc"})
    assert listed.status_code == 400 and 'data-entry="passwd"' not in listed.content.decode()
    followed = console.get(f"{base}download/", {"path": "/root/autodl-tmp/latest/out"})
    assert followed.status_code == 200 and b"".join(followed.streaming_content) == b"ok\n"


def test_a_download_streams_through_the_web_tier_without_holding_the_file(running):
    instance, console = running
    in_container(instance, "dd", "if=/dev/urandom", "of=/root/autodl-tmp/big", "bs=1M", "count=64")
    expected = in_container(instance, "sha256sum", "/root/autodl-tmp/big").split()[0].decode()
    digest, size = hashlib.sha256(), 0
    tracemalloc.start()
    try:
        response = console.get(f"/instances/{instance.pk}/files/download/", {"path": "/root/autodl-tmp/big"})
        for chunk in response.streaming_content:
            digest.update(chunk)
            size += len(chunk)
        response.close()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size == 64 * MB and digest.hexdigest() == expected
    assert peak < 16 * MB, f"the download held {peak / MB:.1f} MB at once (web tier and relay together)"


def test_a_large_upload_streams_to_the_container_without_being_held_in_memory(running, user):
    instance, _ = running
    body = hashlib.sha256(b"seed").digest() * (48 * MB // 32)
    form = {"dir": "/root/autodl-tmp", "file": SimpleUploadedFile("big.bin", body)}
    request = RequestFactory().post(f"/instances/{instance.pk}/files/upload/", form)  # encoded before measuring
    request.user, request.session, request._dont_enforce_csrf_checks = user, SessionStore(), True
    request._messages = FallbackStorage(request)
    tracemalloc.start()
    try:
        response = files.instance_file_upload(request, instance.pk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 302, [str(m) for m in request._messages]
    digest = in_container(instance, "sha256sum", "/root/autodl-tmp/big.bin").split()[0].decode()
    assert digest == hashlib.sha256(body).hexdigest()
    assert peak < 16 * MB, f"the upload held {peak / MB:.1f} MB at once (web tier and relay together)"


def test_sessions_beyond_the_users_cap_are_refused_with_429_until_one_ends(running, settings, user):
    instance, console = running
    settings.RELAY_MAX_SESSIONS_PER_USER = 2
    base = f"/instances/{instance.pk}/files/"
    in_container(instance, "dd", "if=/dev/zero", "of=/root/autodl-tmp/f", "bs=1M", "count=8")
    first = console.get(f"{base}download/", {"path": "/root/autodl-tmp/f"})
    held = SessionSlot(user.pk).take()  # e.g. a terminal on another web server
    try:
        refused = console.get(base)
        assert refused.status_code == 429 and "sessions open" in refused.content.decode()
        assert console.get(f"{base}download/", {"path": "/root/autodl-tmp/f"}).status_code == 429
        first.close()  # the download ends: its slot is free again
        assert console.get(base).status_code == 200
    finally:
        held.release()


def test_the_web_tier_lists_uploads_and_downloads_with_no_docker_at_all(running, monkeypatch):
    instance, console = running

    def no_docker():
        raise AssertionError("the web tier called Docker")

    monkeypatch.setattr(launcher, "docker_client", no_docker)
    base = f"/instances/{instance.pk}/files/"
    response = console.post(f"{base}upload/", {"dir": "/root/autodl-tmp", "file": SimpleUploadedFile("a.txt", b"hi")})
    assert response.status_code == 302 and "Uploaded" in messages_of(console.get(base))
    assert 'data-entry="a.txt"' in console.get(base).content.decode()
    download = console.get(f"{base}download/", {"path": "/root/autodl-tmp/a.txt"})
    assert b"".join(download.streaming_content) == b"hi"


def test_an_outsider_gets_404(running, outsider):
    instance, _ = running
    other = Client()
    other.force_login(outsider)
    assert other.get(f"/instances/{instance.pk}/files/").status_code == 404
    assert other.get(f"/instances/{instance.pk}/files/download/", {"path": "/root/autodl-tmp/x"}).status_code == 404
    upload = other.post(f"/instances/{instance.pk}/files/upload/", {"file": SimpleUploadedFile("x", b"x")})
    assert upload.status_code == 404


def test_an_upload_without_the_csrf_token_is_refused(running, user):
    instance, _ = running
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    response = strict.post(f"/instances/{instance.pk}/files/upload/", {"file": SimpleUploadedFile("x", b"x")})
    assert response.status_code == 403


def test_a_listing_whose_output_is_not_one_is_refused_naming_the_path(running, api):
    """The listing runs the tenant's own ``sh``: one that prints a line without end is answered with why, at once."""
    instance, _ = running
    replace = "rm -f /bin/sh && printf '#!/bin/busybox sh\\nexec tr \"\\\\\\\\0\" x < /dev/zero\\n' > /bin/sh"
    in_container(instance, "/bin/busybox", "sh", "-c", replace + " && chmod +x /bin/sh")
    answer = api.get(f"/api/v1/instances/{instance.pk}/files/", {"path": "/root/autodl-tmp"})
    assert answer.status_code == 400 and "line longer than" in answer.data["path"][0], answer.data
