"""A Docker engine restart does not stop running instances: on an engine started with ``--live-restore`` (Docker's
"Live restore" page: containers keep running while the daemon is down, and it reconnects to them when it is
back), an instance's container outlives SIGTERM to dockerd and a start with the same options, and the node
agent's reconcile keeps the instance RUNNING. Without the option the same restart ends it: the option is what
keeps it.

The engine is the test's own (its socket, data root, exec root and pid file; no bridge, no iptables, no IP
forwarding change): the machine's main engine, which other tests use, is never restarted.
"""

import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import docker
import pytest
import requests

from agent import images, launcher
from agent.reconcile import agent_reconcile
from scheduler.models import WorkloadStatus
from tests.agent.test_agent import running_instance
from tests.conftest import TEST_IMAGE, make_node

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("dockerd") is None, reason="a Docker engine of its own needs root and dockerd"
    ),
]
S = WorkloadStatus


class PrivateEngine:
    """A dockerd of the test's own, started and stopped the way an operator's restart does it."""

    def __init__(self, base: Path, *, live_restore: bool):
        self.base = base
        self.run = Path(f"/run/gct-lr-{uuid.uuid4().hex[:8]}")  # short: containerd's socket lives below it
        self.socket = self.run / "docker.sock"
        config = base / "daemon.json"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text("{}\n")  # none of the machine's /etc/docker/daemon.json
        self.options = [
            "dockerd",
            f"--config-file={config}",
            f"--host=unix://{self.socket}",
            f"--data-root={base / 'data'}",
            f"--exec-root={self.run / 'exec'}",
            f"--pidfile={self.run / 'dockerd.pid'}",
            "--bridge=none",
            "--iptables=false",
            "--ip-forward=false",
            "--shutdown-timeout=5",
            *(["--live-restore"] if live_restore else []),
        ]
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.url, version="1.41", timeout=30)  # no version query at creation

    def start(self) -> None:
        self.run.mkdir(parents=True, exist_ok=True)
        log = (self.base / "dockerd.log").open("ab")
        self.process = subprocess.Popen(
            self.options, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"the private dockerd exited ({self.process.returncode}): {self.log_tail()}")
            try:
                self.client().ping()
                return
            except (requests.ConnectionError, docker.errors.DockerException):  # not listening yet
                time.sleep(0.25)
        pytest.fail(f"the private dockerd did not answer within 60 s: {self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM, as `systemctl stop docker` sends it; wait for the daemon to exit."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def log_tail(self) -> str:
        return (self.base / "dockerd.log").read_text(errors="replace")[-1500:]

    def remove(self) -> None:
        """Everything it ran and left: its containers and volumes, the daemon, its containerd, its mounts."""
        try:
            if self.process is not None and self.process.poll() is None:
                client = self.client()
                for container in client.containers.list(all=True):
                    container.remove(force=True)
                for volume in client.volumes.list():
                    volume.remove(force=True)
        finally:
            self.stop()
        containerd = self.run / "exec" / "containerd" / "containerd.pid"
        try:
            pid = int(containerd.read_text())
            if str(self.run) in Path(f"/proc/{pid}/cmdline").read_text():
                os.kill(pid, signal.SIGKILL)  # only the containerd this engine started
        except (OSError, ValueError):
            pass
        with open("/proc/mounts") as mounts:
            ours = [line.split()[1] for line in mounts if str(self.run) in line or str(self.base) in line]
        for mount in sorted(ours, reverse=True):
            subprocess.run(["umount", "-l", mount], check=False)
        shutil.rmtree(self.run, ignore_errors=True)
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def engine(tmp_path, settings, request):
    """The agent's engine is a private one (``live_restore`` from the test's parameter)."""
    private = PrivateEngine(tmp_path / "engine", live_restore=request.param)
    try:
        private.start()
        settings.DOCKER_BASE_URL = private.url
        launcher.docker_client.cache_clear()
        launcher.engine_info.cache_clear()
        images.stand_in_ensure(TEST_IMAGE)
        yield private
    finally:
        private.remove()
        launcher.docker_client.cache_clear()  # the next one is made for the main engine (settings restored)
        launcher.engine_info.cache_clear()


def engine_restart(engine: PrivateEngine, w) -> int:
    """Stop the engine (SIGTERM), and return the pid of ``w``'s container's first process while it is down."""
    pid = launcher.docker_client().containers.get(w.container_name).attrs["State"]["Pid"]
    engine.stop()
    alive = Path(f"/proc/{pid}").exists()
    # The agent's reconcile while the engine is down reads nothing and changes nothing.
    with pytest.raises((requests.ConnectionError, docker.errors.DockerException)):
        agent_reconcile(w.node.name)
    w.refresh_from_db()
    assert w.status == S.RUNNING
    engine.start()  # the same options
    return pid if alive else 0


@pytest.mark.parametrize("engine", [True], indirect=True, ids=["live-restore"])
def test_an_engine_restart_with_live_restore_keeps_the_instance_running(user, engine):
    node = make_node("sim:1xRTX3090")
    w = running_instance(user, node, TEST_IMAGE)

    pid = engine_restart(engine, w)

    assert pid, "the container's process died with the engine"
    # The agent's own client, kept across the restart as a running agent keeps it.
    container = launcher.docker_client().containers.get(w.container_name)
    assert (container.status, container.attrs["State"]["Pid"]) == ("running", pid)
    assert launcher.containers_on_node(node.name)[w.uid].running
    agent_reconcile(node.name)
    w.refresh_from_db()
    assert w.status == S.RUNNING, w.status_reason
    assert not w.events.filter(to_status__in=[S.STOPPED, S.FAILED]).exists()


@pytest.mark.parametrize("engine", [False], indirect=True, ids=["no-live-restore"])
def test_without_live_restore_the_same_restart_ends_the_instance(user, engine):
    node = make_node("sim:1xRTX3090")
    w = running_instance(user, node, TEST_IMAGE)

    assert engine_restart(engine, w) == 0  # the engine stopped the container as it went down
    assert not launcher.containers_on_node(node.name)[w.uid].running
    agent_reconcile(node.name)
    w.refresh_from_db()
    assert w.status == S.STOPPED and "exited" in w.status_reason
