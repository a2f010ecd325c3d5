"""A container sees its own limits: nproc from its cpuset, free and /proc from LXCFS (real containers)."""

import os
import shutil
import subprocess
import time
from collections import Counter
from types import SimpleNamespace

import pytest
from django.conf import settings
from docker.models.containers import ContainerCollection

from agent import hostview, launcher
from agent.actions import agent_launch
from agent.reconcile import agent_reconcile
from scheduler.models import WorkloadStatus
from scheduler.services.allocation import Share, allocation_create
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


@pytest.fixture
def node(sim_node):
    """Two RTX 3090s (indexes 0, 1) and an A100 of simulated cards; its containers go afterwards."""
    return sim_node


@pytest.fixture
def lxcfs(tmp_path, settings):
    """Debian's lxcfs, run for this test on its own mount point."""
    if shutil.which("lxcfs") is None:
        pytest.fail("lxcfs is not installed (Debian package lxcfs)")
    mount = tmp_path / "lxcfs"
    mount.mkdir()
    # Its own pidfile: with the default (/run/lxcfs.pid) it refuses to start beside the machine's own lxcfs
    # (the one `make run` leaves for its instances, or Debian's service).
    pidfile = tmp_path / "lxcfs.pid"
    daemon = subprocess.Popen(
        ["lxcfs", "-f", "-p", str(pidfile), str(mount)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 20
    while not (mount / "proc" / "meminfo").exists():
        assert daemon.poll() is None and time.monotonic() < deadline, "lxcfs did not mount"
        time.sleep(0.1)
    settings.INSTANCE_LXCFS, settings.LXCFS_DIR = "on", str(mount)
    yield mount
    daemon.terminate()
    daemon.wait(timeout=20)
    if os.path.ismount(mount):  # lxcfs unmounts itself on SIGTERM; a lazy unmount if it could not
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def launched(user, node, image, *, cpu=1, memory_mb=256, card=0):
    gpu = node.gpus.get(index=card)
    w = workload(user, cpu=cpu, memory_mb=memory_mb, image_ref=image)
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(gpu.pk, 1000, gpu.memory_mb)])
    agent_launch(w.pk)
    w.refresh_from_db()
    assert w.status == WorkloadStatus.RUNNING, w.status_reason
    return launcher.docker_client().containers.get(w.container_name)


def run(container, command: str) -> str:
    return container.exec_run(["sh", "-c", command]).output.decode().strip()


def test_a_one_core_instance_sees_one_core(user, node, base_image):
    assert (os.cpu_count() or 1) >= 2, "this test needs a host with two cores or more"
    container = launched(user, node, base_image, cpu=1)
    assert run(container, "nproc") == "1"
    assert len(hostview.cpu_list(container.attrs["HostConfig"]["CpusetCpus"])) == 1


def test_two_one_core_instances_are_pinned_to_different_cores(user, node, base_image):
    first = launched(user, node, base_image, cpu=1, card=0)
    second = launched(user, node, base_image, cpu=1, card=1)
    assert first.attrs["HostConfig"]["CpusetCpus"] != second.attrs["HostConfig"]["CpusetCpus"]


def test_a_stopped_instance_started_again_is_pinned_again(user, node, base_image):
    container = launched(user, node, base_image, cpu=1)
    container.stop(timeout=1)
    container.update(cpuset_cpus="0,1")  # as if its cores had been set otherwise while it was stopped
    hostview.container_start(launcher.docker_client(), container, {"nano_cpus": 10**9, "labels": container.labels})
    container.reload()
    assert run(container, "nproc") == "1"


def test_free_and_proc_show_the_containers_own_memory_and_cores_under_lxcfs(user, node, base_image, lxcfs):
    container = launched(user, node, base_image, cpu=1, memory_mb=256)
    assert run(container, "grep MemTotal /proc/meminfo").split()[1] == str(256 * 1024)
    assert run(container, "grep -c ^processor /proc/cpuinfo") == "1"
    assert run(container, "cat /sys/devices/system/cpu/online") in {"0", "1"}
    mounts = {m["Destination"]: m for m in container.attrs["Mounts"]}
    assert mounts["/proc/meminfo"]["Source"] == str(lxcfs / "proc" / "meminfo")
    assert mounts["/proc/meminfo"]["RW"] is False


def test_lxcfs_required_but_absent_fails_the_launch_saying_so(user, node, base_image, settings, tmp_path):
    settings.INSTANCE_LXCFS, settings.LXCFS_DIR = "on", str(tmp_path / "nothing")
    gpu = node.gpus.get(index=0)
    w = workload(user, image_ref=base_image)
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(gpu.pk, 1000, gpu.memory_mb)])
    agent_launch(w.pk)
    w.refresh_from_db()
    assert w.status == WorkloadStatus.FAILED
    assert "LXCFS is not mounted" in w.status_reason


def test_cores_are_chosen_least_used_first_then_lowest():
    assert hostview.cpus_choose(2, 4, Counter({0: 1, 1: 1})) == "2,3"
    assert hostview.cpus_choose(1, 4, Counter({0: 2, 1: 1, 2: 1, 3: 1})) == "1"
    assert hostview.cpus_choose(3, 2, Counter()) == "0,1"  # never more cores than the host has
    assert hostview.cpu_list("0-2,5") == [0, 1, 2, 5]


def pinned_load() -> Counter:
    with hostview.pins.lock:
        return hostview.pins.load(launcher.docker_client(), {"labels": {"gpucloud.deployment": settings.DEPLOYMENT_ID}})


def test_a_launch_lists_no_containers_once_the_agent_has_read_its_engine(user, node, base_image, monkeypatch):
    launched(user, node, base_image, cpu=1, card=0)  # the first launch reads the engine's pins
    lists = []
    real = ContainerCollection.list
    monkeypatch.setattr(ContainerCollection, "list", lambda self, *a, **kw: lists.append(kw) or real(self, *a, **kw))

    second = launched(user, node, base_image, cpu=1, card=1)

    assert lists == []
    assert pinned_load()[hostview.cpu_list(second.attrs["HostConfig"]["CpusetCpus"])[0]] >= 1


def test_the_cores_of_a_container_that_ended_by_itself_are_free_after_the_reconcile_that_follows(
    user, node, base_image
):
    container = launched(user, node, base_image, cpu=1)
    core = hostview.cpu_list(container.attrs["HostConfig"]["CpusetCpus"])[0]
    assert pinned_load()[core] == 1
    container.kill()  # not through the agent: as a job that finishes, or a crash

    agent_reconcile(node.name)  # what the agent runs on the container's exit (Docker's "die" event)

    assert pinned_load()[core] == 0


def test_what_a_launch_or_stop_changed_after_a_reconcile_read_docker_outlives_that_reconcile():
    pins = hostview.PinnedCores()
    nothing = SimpleNamespace(containers=SimpleNamespace(list=lambda **kw: []))
    on = {"labels": {"gpucloud.node": "n1", "gpucloud.deployment": "d"}}
    with pins.lock:
        pins.load(nothing, on)  # read: empty
        pins.pinned("stopped-during-the-read", on, "0")
        pins.pinned("gone-behind-our-back", on, "2")
        pins.pinned("other-node", {"labels": {"gpucloud.node": "n2"}}, "3")
    since = pins.mark()
    with pins.lock:
        pins.pinned("launched-during-the-read", on, "1")
    pins.unpinned("stopped-during-the-read")

    # Docker was read before the launch and the stop: it shows the stopped one live, the launched one not.
    pins.reset("n1", {"stopped-during-the-read": [0]}, since=since)

    with pins.lock:
        load = pins.load(nothing, on)
    assert load == Counter({1: 1, 3: 1})  # the launch kept, the stop kept, the vanished gone, n2 untouched
