"""Restarting the node agent leaves a fractional tenant's MPS daemon, server and connection as they were, and
its ``/root/autodl-fs``.

The agent runs as a process here (``HOST_SERVICES=process``): the card's daemon and the JuiceFS client
detach from it (their own sessions, adopted by init), so a SIGKILL of the agent's whole process group
reaches neither, and the agent that starts again finds the daemon answering, configured for the card's
size, and the volume mounted, and leaves both alone (``agent/hostservices.py``). The NVIDIA tools are the
r580 fakes of ``tests/fakes/nvidia``; the shared storage is a real JuiceFS volume (``tests/agent/test_sharedfs.py``'s).
"""

import os
import signal
from pathlib import Path

import pytest
from django.test import override_settings

from agent import launcher, mps
from agent import sharedfs as host_fs
from scheduler.models import Node, WorkloadStatus
from tests.conftest import wait_for, wait_status
from tests.fakes.nvidia import first_line, installed


@pytest.fixture
def nvidia(monkeypatch):
    with installed(monkeypatch, []) as fake:
        monkeypatch.delenv("FAKE_NVIDIA_CARDS")  # the cards are declared once the node has registered
        yield fake


@pytest.fixture
def cluster_env(nvidia, volume, tmp_path, monkeypatch):
    shared = {key: str(value) for key, value in volume["settings"].items()}
    for key in ("SHARED_FS_ACCESS_KEY", "SHARED_FS_SECRET_KEY"):
        monkeypatch.setenv(key, volume["keys"][key])
    mount = tmp_path / "sharedfs" / "mnt"
    yield {
        "GPU_SHARE_ENFORCE": "mps", "MPS_DIR": str(tmp_path / "mps"), "MPS_WATCH_S": "1", "TRANSITION_DEADLINE_S": "60",
        **shared, "SHARED_FS_MOUNT": str(mount), "SHARED_FS_CACHE_DIR": str(mount.parent / "cache"),
    }  # fmt: skip
    with override_settings(**volume["settings"]):
        left = host_fs.unmount(str(mount))
    for pid in left:
        os.kill(pid, signal.SIGKILL)


def test_an_agent_killed_and_started_again_leaves_the_cards_daemon_its_tenant_and_the_shared_storage_running(
    cluster, catalog, nvidia, cluster_env
):
    node = Node.objects.get(name=cluster.node_name)
    nvidia.declare([f"{g.uuid}:{g.memory_mb}:NVIDIA GeForce RTX 3090:82" for g in node.gpus.order_by("index")])
    w = cluster.create_instance(catalog, gpus="0.5")
    wait_status(w, "running", timeout=60)
    card = mps.MpsHost(Path(cluster_env["MPS_DIR"])).card(w.allocations.get().gpu.uuid)
    daemons = nvidia.daemons()
    tenant = nvidia.client(card.pipe, hold=300)
    assert first_line(tenant)["thread_percentage"] == 50
    container = launcher.docker_client().containers.get(w.container_name)
    assert container.exec_run(["sh", "-c", "echo kept > /root/autodl-fs/before"]).exit_code == 0
    juicefs = host_fs.client_pids(cluster_env["SHARED_FS_MOUNT"])
    assert juicefs

    epoch = Node.objects.get(pk=node.pk).epoch
    cluster.kill("agent")  # SIGKILL to its process group
    assert card.answers() and nvidia.daemons() == daemons
    cluster.start("agent")
    wait_for(lambda: Node.objects.get(pk=node.pk).epoch > epoch, timeout=60, what="the agent to register again")
    cluster.wait_converged()

    assert nvidia.daemons() == daemons, "the agent that came back started no second daemon"
    assert tenant.poll() is None and [c.pid for c in card.clients()] == [tenant.pid]
    assert card.configured_class() == 500
    w.refresh_from_db()
    assert w.status == WorkloadStatus.RUNNING
    assert container.exec_run(["ls", "-A", "/tmp/nvidia-mps"]).output.decode().strip() == "control"
    assert host_fs.client_pids(cluster_env["SHARED_FS_MOUNT"]) == juicefs, "the same JuiceFS client, never remounted"
    kept = container.exec_run(["sh", "-c", "cat /root/autodl-fs/before && echo after > /root/autodl-fs/after"])
    assert (kept.exit_code, kept.output.decode().strip()) == (0, "kept")
