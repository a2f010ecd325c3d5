"""A whole cluster in real processes, for fault injection: its own Redis, the web server, the
scheduler worker with beat, and a node agent, all on the test database.

Faults are real: ``kill -9`` of a process group, SIGSTOP / SIGCONT of dockerd or of the agent,
a Redis restart. The test drives the platform through its HTTP API only, so every message is
published by the cluster's own processes, on the cluster's own Redis.
"""

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass, field

import pytest
import redis
import requests
from django.conf import settings
from django.db import connection

from agent import launcher
from portal.services.tokens import token_create
from scheduler.models import Allocation, Gpu, Node, Workload, WorkloadStatus
from tests.agent.test_sharedfs import volume  # noqa: F401  (a JuiceFS volume, for test_host_services)
from tests.conftest import NO_DOCKER, database_url, remove_node_containers, wait_for
from tests.ports import free_port

RECONCILE_S = 1  # beat: scheduler tick and cluster reconciliation every second
DEADLINE_S = 8  # transitional states (past an agent's start-up on a loaded 2-core machine)
LOST_AFTER_S = 8  # silent node (its agent fences its own jobs after 8 - 1 - 2 * 1 = 5 s without contact)
# "Converged within two reconciliation periods" of whatever the fault needs first (a deadline,
# a node declared lost), with slack for process start-up on a loaded 2-core machine.
CONVERGE_S = 2 * RECONCILE_S + DEADLINE_S + 10


@dataclass
class Cluster:
    node_name: str
    redis_port: int
    redis_password: str
    web_port: int
    env: dict
    token: str
    logs: str
    processes: dict = field(default_factory=dict)
    env_for: dict = field(default_factory=dict)  # per-role overrides, e.g. the agent's own database role
    wrap: dict = field(default_factory=dict)  # per-role command prefix, e.g. faketime for a skewed clock

    # --- processes -------------------------------------------------------------------------
    def log_path(self, role: str) -> str:
        """Where the process of ``role`` writes its output."""
        return f"{self.logs}/{self.node_name}-{role}.log"

    def start(self, role: str) -> subprocess.Popen:
        python = sys.executable
        commands = {
            "redis": [
                shutil.which("redis-server"),
                "--port",
                str(self.redis_port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--requirepass",
                self.redis_password,
            ],
            "web": [python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.web_port), "config.asgi:application"],
            "scheduler": [
                python,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "-B",
                "-Q",
                self.env["SCHEDULER_QUEUE"],
                "--pool",
                "threads",
                "--concurrency",
                "2",
                "-s",
                f"{self.logs}/beat-schedule-{self.node_name}",
                "--without-gossip",
                "--without-mingle",
                "--loglevel",
                "INFO",
            ],
            "agent": [python, "manage.py", "node_agent", "--name", self.node_name],
        }
        log = open(self.log_path(role), "a")  # noqa: SIM115  (kept for the process)
        process = subprocess.Popen(
            [*self.wrap.get(role, []), *commands[role]],
            env=self.env | self.env_for.get(role, {}),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=settings.BASE_DIR,
            start_new_session=True,  # its own process group: kill -9 takes its children too
        )
        self.processes[role] = process
        return process

    def redis(self) -> redis.Redis:
        return redis.Redis(port=self.redis_port, password=self.redis_password)

    def kill(self, role: str, sig=signal.SIGKILL) -> None:
        process = self.processes[role]
        os.killpg(process.pid, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            process.wait(30)

    def signal(self, role: str, sig) -> None:
        os.killpg(self.processes[role].pid, sig)

    def stop_all(self) -> None:
        for role in ("agent", "scheduler", "web", "redis"):
            process = self.processes.get(role)
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGCONT)
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(10)

    # --- the API, as a user ----------------------------------------------------------------
    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        return requests.request(
            method,
            f"http://127.0.0.1:{self.web_port}/api/v1/{path}",
            headers={"Authorization": f"Token {self.token}"},
            timeout=30,
            **kwargs,
        )

    def create_instance(self, catalog, **overrides) -> Workload:
        body = {"image": catalog["image"].pk, "gpu_type": catalog["rtx3090"].pk, "gpus": "1", "cpu_cores": 1}
        body |= {"memory_gb": 1, "disk_gb": 5} | overrides
        response = self.api("post", "instances/", json=body)
        assert response.status_code == 201, response.text
        return Workload.objects.get(instance__pk=response.json()["id"])

    def create_job(self, catalog, command: str) -> Workload:
        body = {"image": catalog["image"].pk, "gpu_type": catalog["rtx3090"].pk, "gpus": "1", "cpu_cores": 1}
        response = self.api("post", "jobs/", json=body | {"memory_gb": 1, "command": command})
        assert response.status_code == 201, response.text
        return Workload.objects.get(job__pk=response.json()["id"])

    # --- what must hold once it has converged ----------------------------------------------
    def converged(self) -> list[str]:
        """What is still wrong (empty once converged): orphans, over-allocation, meters, lost work."""
        from billing.metering import running_intervals
        from billing.models import MeterSegment

        problems = []
        connection.close()  # a fresh view of the database
        holding = set(WorkloadStatus.holding_resources())
        containers = launcher.containers_on_node(self.node_name)  # read once: Docker first, then the database
        workloads = {w.uid: w for w in Workload.objects.select_related("node")}
        for uid, state in containers.items():
            w = workloads.get(uid)
            if state.running and (w is None or w.status not in holding or w.node.name != self.node_name):
                problems.append(f"orphan: container {state.name} runs for {w.status if w else 'nothing'}")
        for w in workloads.values():
            if w.status in (WorkloadStatus.STARTING, WorkloadStatus.STOPPING, WorkloadStatus.RELEASING):
                problems.append(f"workload {w.pk} still {w.status}")
            state = containers.get(w.uid)
            if w.status == WorkloadStatus.RUNNING and (state is None or not state.running):
                problems.append(f"workload {w.pk} is running with no running container")
            if w.status not in holding and Allocation.objects.filter(workload=w).exists():
                problems.append(f"workload {w.pk} is {w.status} but holds shares")
            segments = [
                (s.started_at, s.ended_at) for s in MeterSegment.objects.filter(workload=w).order_by("started_at")
            ]
            ran = [(start, end) for start, end, _ in running_intervals(w.events.order_by("created_at", "id"))]
            if segments != ran:
                problems.append(f"workload {w.pk} metered {segments}, ran {ran}")
        for card in Gpu.objects.filter(node__name=self.node_name):
            held = sum(Allocation.objects.filter(gpu=card).values_list("milli", flat=True))
            if card.allocated_milli != held or held > 1000:
                problems.append(f"card {card.uuid}: allocated {card.allocated_milli}, held by allocations {held}")
        return problems

    def wait_converged(self, timeout: float = CONVERGE_S) -> None:
        last = []

        def ok():
            nonlocal last
            last = self.converged()
            return not last

        try:
            wait_for(ok, timeout=timeout, what="the cluster to converge")
        except AssertionError:
            raise AssertionError(f"not converged after {timeout}s: {last}") from None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test shows the end of each of its cluster's process logs: what the scheduler, the agent and
    the web server were doing when the wait ran out (CI keeps no files); the scheduler worker's without its
    embedded beat's lines (a few a second). Then, where the test itself failed, the scheduler worker is asked where
    each of its threads is (Celery's SIGUSR1 handler writes their stacks to its log): a worker that stopped
    consuming says where it stopped, and one that is gone says how it ended."""
    report = yield
    c = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and isinstance(c, Cluster):
        for role in c.processes:
            path = c.log_path(role)
            with contextlib.suppress(OSError), open(path, errors="replace") as f:
                lines = f.readlines()
            if role == "scheduler":
                lines = [line for line in lines if "/Beat]" not in line]
            report.sections.append((f"{role} log (last 80 lines)", "".join(lines[-80:])))
        if report.when == "call":  # the cluster still runs (its teardown stops it)
            report.sections.append(("the scheduler worker's threads", _threads(c)))
    return report


def _threads(c: Cluster) -> str:
    """Where the scheduler worker's threads are: the stacks Celery's SIGUSR1 handler (``install_cry_handler``)
    writes to its log, without their local variables."""
    process = c.processes.get("scheduler")
    if process is None or process.poll() is not None:
        return f"the worker is gone: {None if process is None else process.returncode}"
    path = c.log_path("scheduler")
    start = os.path.getsize(path)
    os.kill(process.pid, signal.SIGUSR1)  # the worker's own process: its beat child has no handler for it
    with contextlib.suppress(AssertionError):
        wait_for(lambda: os.path.getsize(path) > start, timeout=5, what="the worker's stacks")
    with open(path, errors="replace") as f:
        f.seek(start)
        text = f.read()
    return re.sub(r"LOCAL VARIABLES\n=+\n.*?\n\n\n", "", text, flags=re.DOTALL)


@pytest.fixture
def cluster(transactional_db, user, catalog, base_image, tmp_path, cluster_env):
    if connection.vendor != "postgresql":
        pytest.fail("run on PostgreSQL (make test does)")
    name = f"fault-{uuid.uuid4().hex[:6]}"
    redis_port, web_port, redis_password = free_port(), free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": f"redis://:{redis_password}@127.0.0.1:{redis_port}/0",  # as production: a password
        "SCHEDULER_QUEUE": f"scheduler-{name}",
        "DEPLOYMENT_ID": settings.DEPLOYMENT_ID,
        "CACHE_KEY_PREFIX": name,
        "GPU_BACKEND": "sim:2xRTX3090",
        "NODE_HEARTBEAT_S": "1",
        "NODE_LOST_AFTER_S": str(LOST_AFTER_S),
        "SCHEDULER_TICK_S": str(RECONCILE_S),
        "RECONCILE_S": str(RECONCILE_S),
        "METER_RECONCILE_S": "2",
        "TRANSITION_DEADLINE_S": str(DEADLINE_S),
        "LAUNCH_RESEND_S": "2",
        "INSTANCE_STOP_GRACE_S": "1",
        "PREEMPTION_GRACE_S": "1",
        "DB_CONN_MAX_AGE": "0",
        "RELAY_PORT": "0",  # the agent's relay on any free port (several clusters may run at once)
        "LOG_LEVEL": "INFO",
        **cluster_env,
    }
    logs = str(settings.VAR_DIR / "log")
    os.makedirs(logs, exist_ok=True)
    c = Cluster(name, redis_port, redis_password, web_port, env, token_create(user=user, name="faults")[1], logs)
    c.env_for["web"] = {"DOCKER_BASE_URL": NO_DOCKER}  # as in production: the web tier has no Docker
    try:
        c.start("redis")
        wait_for(lambda: _listening(redis_port), timeout=10, what="redis")
        c.start("web")
        c.start("scheduler")
        c.start("agent")
        wait_for(lambda: _listening(web_port), timeout=30, what="the web server")
        wait_for(lambda: Node.objects.filter(name=name).exists(), timeout=30, what="the node agent to register")
        yield c
    finally:
        c.stop_all()
        remove_node_containers(name)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def dockerd_pid() -> int:
    """The engine the tests use (the root one), never another dockerd on the machine (a several-host
    setup's, a production bring-up's): its pid file, checked against the process it names."""
    pid = int(open("/var/run/docker.pid").read().strip())
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        command = f.read().split(b"\0")
    if b"-H" in command or any(part.startswith(b"--exec-root") for part in command):
        raise AssertionError(f"/var/run/docker.pid names {pid}, which is not the root engine: {command}")
    return pid
