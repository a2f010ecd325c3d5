"""What runs in an instance stays in its cgroup: memory, processes, shared memory (real containers)."""

import io
import subprocess
import tarfile
from unittest import mock

import pytest

from agent import launcher
from agent.actions import agent_launch, agent_stop
from agent.reconcile import agent_reconcile
from scheduler.models import WorkloadCode, WorkloadStatus
from scheduler.services import code
from scheduler.services.allocation import Share, allocation_create
from scheduler.services.lifecycle import workload_transition
from tests.conftest import make_node, remove_node_containers, wait_for, wait_status
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


@pytest.fixture
def node():
    node = make_node("sim:1xRTX3090")
    yield node
    remove_node_containers(node.name)


def launched(w, node):
    card = node.gpus.get()
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    agent_launch(w.pk)
    w.refresh_from_db()
    assert w.status == WorkloadStatus.RUNNING, w.status_reason
    return launcher.docker_client().containers.get(w.container_name)


def test_a_memory_hog_is_oom_killed_in_its_own_cgroup_and_says_out_of_memory(user, node, base_image):
    hog = workload(
        user,
        kind="job",
        image_ref=base_image,
        memory_mb=64,
        command=["sh", "-c", "head -c 400000000 /dev/zero | tail -c 300000000 > /dev/null"],
    )
    launched(hog, node)

    wait_status(hog, "failed", timeout=30, poke=lambda: agent_reconcile(node.name))
    assert hog.status_reason == "container exited with code 137 (out of memory)"
    assert subprocess.run(["true"]).returncode == 0  # the host is untouched


def test_a_fork_bomb_is_held_at_the_pids_limit_and_the_instance_still_stops(user, node, base_image, settings):
    settings.INSTANCE_PIDS_LIMIT = 48
    # A failed fork ends the shell that tried it, and a container ends with its first process: so the first
    # process forks once and becomes a sleeper; behind it a classic bomb churns while three fillers start
    # sleepers until the limit refuses them, so the count reaches the limit and stays there until the stop.
    flood = (
        "fill(){ while :; do sleep 600 & done; }; bomb(){ bomb | bomb & }; (fill & fill & fill & bomb) & exec sleep 600"
    )
    bomb = workload(user, image_ref=base_image, command=["sh", "-c", flood])
    container = launched(bomb, node)

    wait_for(
        lambda: (container.stats(stream=False).get("pids_stats", {}).get("current") or 0) >= 40,
        timeout=30,
        what="the fork bomb to fill its pids limit",
    )
    assert container.stats(stream=False)["pids_stats"]["current"] <= 48
    assert subprocess.run(["sh", "-c", "for i in 1 2 3 4 5 6 7 8; do true & done; wait"]).returncode == 0

    assert workload_transition(bomb, to=WorkloadStatus.STOPPING, allowed_from=[WorkloadStatus.RUNNING])
    settings.INSTANCE_STOP_GRACE_S = 1
    agent_stop(bomb.pk)
    bomb.refresh_from_db()
    assert bomb.status == WorkloadStatus.STOPPED
    container.reload()
    assert container.status != "running"


def test_containers_get_a_shared_memory_size_within_their_memory_limit(user, node, base_image, settings):
    settings.INSTANCE_SHM_MB = 8192
    container = launched(workload(user, image_ref=base_image, memory_mb=1024), node)
    assert container.attrs["HostConfig"]["ShmSize"] == 512 * 1024 * 1024  # half of its 1 GB
    out = container.exec_run(["df", "-m", "/dev/shm"]).output.decode()
    assert " 512 " in out, out


def test_the_data_volume_holds_disk_gb_and_writing_past_it_says_no_space_left(
    user, node, base_image, settings, tmp_path
):
    settings.INSTANCE_DISK_QUOTA, settings.VOLUMES_DIR = True, str(tmp_path)
    filler = workload(
        user,
        kind="job",
        image_ref=base_image,
        command=[
            "sh",
            "-c",
            "dd if=/dev/zero of=$GPUCLOUD_CHECKPOINT_DIR/fill bs=1M count=1200; df -m $GPUCLOUD_CHECKPOINT_DIR",
        ],
    )
    type(filler).objects.filter(pk=filler.pk).update(disk_gb=1)
    filler.refresh_from_db()
    try:
        launched(filler, node)
        wait_status(filler, "succeeded", timeout=60, poke=lambda: agent_reconcile(node.name))  # its df ran last
        assert "No space left on device" in filler.log_tail
        assert (tmp_path / f"{filler.volume_name}.img").stat().st_blocks * 512 < 1.2 * 1024**3  # sparse, ≤ 1 GB used
    finally:
        launcher.container_remove(filler)
    assert not (tmp_path / filler.volume_name).exists() and not (tmp_path / f"{filler.volume_name}.img").exists()


def test_a_stored_code_archive_that_expands_past_its_cap_fails_the_launch_before_docker_expands_it(
    user, node, base_image, monkeypatch
):
    """Docker expands a job's code in its own daemon, outside the job's cgroup: an archive stored before the cap
    (submitting checks it) is checked again at launch, and a bomb never reaches Docker."""
    monkeypatch.setattr(code, "CODE_EXPANDED_MAX_MB", 1, raising=False)  # not there before the cap
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        entry = tarfile.TarInfo("zeros.bin")
        entry.size = 64 * 1024 * 1024
        tar.addfile(entry, io.BytesIO(bytes(entry.size)))
    job = workload(user, kind="job", image_ref=base_image, command=["true"])
    WorkloadCode.objects.create(workload=job, archive=packed.getvalue(), size_bytes=len(packed.getvalue()), sha256="")
    card = node.gpus.get()
    assert allocation_create(workload=job, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    with mock.patch.object(launcher.docker_client().api, "put_archive") as put_archive:
        agent_launch(job.pk)
    job.refresh_from_db()
    assert job.status == WorkloadStatus.FAILED and "expands to more than 1 MB" in job.status_reason, job.status_reason
    assert not put_archive.called
