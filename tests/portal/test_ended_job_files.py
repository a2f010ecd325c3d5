"""A job's files after it ended (issue 32 §6: `gpucloud cp j1:/root/checkpoints/model.pt .` was refused once the
job had finished): its container is removed when it ends, but its disk (/root/checkpoints) stays on its host until
it is released, read through a helper container given the disk read-only. Uploads and terminals still need it to
run; once released, nothing is there to read."""

import contextlib
import uuid

import pytest

from agent import launcher
from agent.labels import LABEL
from agent.launcher import docker_client
from tests.conftest import wait_for, wait_status
from tests.portal.test_jobs_and_preemption import reconcile, submit_job

pytestmark = pytest.mark.django_db(transaction=True)
WRITES = (
    "mkdir -p /root/checkpoints/sub && printf weights > /root/checkpoints/model.pt && "
    "echo a > /root/checkpoints/sub/a && echo out > /root/result.txt"
)


def helpers(container: str) -> list:
    return docker_client().containers.list(all=True, filters={"label": f"{LABEL}.files-helper={container}"})


def body(response) -> bytes:
    assert response.status_code == 200, response
    return b"".join(response.streaming_content)


def test_an_ended_jobs_files_are_listed_and_downloaded_until_it_is_released(api, catalog, node_worker):
    job = submit_job(api, catalog, command=WRITES)
    wait_status(job.workload, "succeeded", timeout=60, poke=reconcile(node_worker))
    files = f"/api/v1/jobs/{job.pk}/files/"

    listing = api.get(files, {"path": "/root/checkpoints"})
    assert listing.status_code == 200, listing.data
    entries = {e["name"]: e for e in listing.data["entries"]}
    assert entries["model.pt"]["size"] == 7 and not entries["model.pt"]["dir"] and entries["sub"]["dir"]
    assert [e["name"] for e in api.get(files, {"path": "/root/checkpoints/sub"}).data["entries"]] == ["a"]
    assert body(api.get(f"{files}download/", {"path": "/root/checkpoints/model.pt"})) == b"weights"
    # The rest of the job's container is gone with it: only its disk is left to read.
    for outside in (api.get(files, {"path": "/root"}), api.get(f"{files}download/", {"path": "/root/result.txt"})):
        assert outside.status_code == 400 and "/root/checkpoints" in str(outside.data["path"]), outside.data
    # The listing's helper is gone once it has answered.
    wait_for(lambda: not helpers(job.workload.container_name), timeout=30, what="the helper to be removed")

    upload = api.put(f"{files}upload/?path=/root/checkpoints&name=x", b"x", content_type="application/octet-stream")
    assert upload.status_code == 409 and "until it is released" in upload.data["detail"], upload.data

    assert api.post(f"/api/v1/jobs/{job.pk}/release/").status_code == 202
    wait_status(job.workload, "released", timeout=30, poke=reconcile(node_worker))
    gone = api.get(files, {"path": "/root/checkpoints"})
    assert gone.status_code == 409 and "released" in gone.data["detail"], gone.data


def test_a_disk_held_by_a_files_helper_is_released_with_it(base_image):
    """A release right after a read (CI met it: 'volume is in use' by the helper Docker was still removing): the
    agent removes the disk's helpers first, and asks again while one is being removed."""
    client = docker_client()
    name = f"gpucloud-test-held-{uuid.uuid4().hex[:8]}"
    client.volumes.create(name=name)
    holder = client.containers.run(
        base_image, ["sleep", "60"], detach=True, network_mode="none",
        volumes={name: {"bind": "/root/checkpoints", "mode": "ro"}}, labels={f"{LABEL}.files-helper": name},
    )  # fmt: skip
    try:
        launcher.volume_delete(name)
        assert not [v for v in client.volumes.list() if v.name == name]
    finally:
        with contextlib.suppress(Exception):
            holder.remove(force=True)
