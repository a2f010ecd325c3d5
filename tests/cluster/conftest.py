"""Several GPU hosts for real: ``config/dev/cluster.sh`` brings up the control plane and three hosts
(network namespaces, each with its own Docker engine and node agent) on the tests' own instance of
the address plan, so a developer's ``make cluster`` (gc*, 10.231-10.233) keeps running beside it.

    prefix gct: bridge gctbr0 10.234.0.1/24, host i = netns gcth<i> at 10.234.0.(10+i),
    engine bridge 10.235.<i>.1/24, tenants 10.236.<i>.0/24

Timings are short (heartbeat 1 s, tick and reconciliation every second) as in tests/faults. The
tests drive the platform as a user does, through its HTTP API, and check the outcome where it
lives: each host's Docker engine (its own socket) and the cluster's own PostgreSQL and Redis.
They run as their own pytest invocation (``-m cluster``; ``make test`` does) and need root; what
is missing fails them, nothing is skipped.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import docker
import psycopg
import pytest
import redis
import requests
from django.conf import settings

from tests.conftest import wait_for

SCRIPT = "config/dev/cluster.sh"
PREFIX, NET, HOSTS = "gct", 234, 3
TIMINGS = {
    "NODE_HEARTBEAT_S": "1",
    "NODE_LOST_AFTER_S": "6",
    "SCHEDULER_TICK_S": "1",
    "RECONCILE_S": "1",
    "METER_RECONCILE_S": "2",
    "TRANSITION_DEADLINE_S": "20",
    "INSTANCE_STOP_GRACE_S": "1",
    "PREEMPTION_GRACE_S": "1",
    # The cluster's database is its own (not pytest's): connections may stay open, so the
    # tests see the agents' connections where they come from.
    "DB_CONN_MAX_AGE": "60",
    "LOG_LEVEL": "INFO",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    """The running cluster, as its script describes it (``cluster.sh env``)."""

    env: dict  # the script's environment (prefix, subnets, directory, ports, timings)
    info: dict  # cluster.sh env: URLs and secrets of the control plane
    tokens: dict  # demo user name -> API token

    prefix: str = PREFIX
    net: int = NET

    @property
    def directory(self) -> Path:
        return Path(self.env["CLUSTER_DIR"])

    def host_address(self, i: int) -> str:
        return f"10.{self.net}.0.{10 + i}"

    def host_netns(self, i: int) -> str:
        return f"/var/run/netns/{self.prefix}h{i}"

    def tenant_subnet(self, i: int) -> str:
        return f"10.{self.net + 2}.{i}.0/24"

    def engine(self, i: int) -> docker.DockerClient:
        return docker.DockerClient(base_url=f"unix:///run/gpucloud-{self.prefix}/h{i}.sock", timeout=60)

    def script(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        result = subprocess.run(
            ["bash", SCRIPT, *args],
            cwd=settings.BASE_DIR,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            pytest.fail(f"cluster.sh {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result

    # --- as a user, over HTTP ----------------------------------------------------------------
    def api(self, method: str, path: str, *, user: str = "demo", **kwargs) -> requests.Response:
        return requests.request(
            method,
            f"{self.info['WEB_URL']}/api/v1/{path}",
            headers={"Authorization": f"Token {self.tokens[user]}"},
            timeout=30,
            **kwargs,
        )

    @cached_property
    def catalog(self) -> dict:
        types = {t["name"]: t["id"] for t in self.api("get", "gpu-types/").json()["results"]}
        images = {i["docker_ref"]: i["id"] for i in self.api("get", "images/").json()["results"]}
        return {"gpu_types": types, "image": images["gpucloud/pytorch:2.5.1-cuda12.4"]}

    def create_instance(self, gpu_type: str, gpus: int = 1) -> dict:
        body = {
            "image": self.catalog["image"],
            "gpu_type": str(self.catalog["gpu_types"][gpu_type]),
            "gpus": str(gpus),
            "cpu_cores": 1,
            "memory_gb": 1,
            "disk_gb": 5,
        }
        response = self.api("post", "instances/", json=body)
        assert response.status_code == 201, response.text
        return response.json()

    def instance(self, instance_id: int) -> dict:
        response = self.api("get", f"instances/{instance_id}/")
        assert response.status_code == 200, response.text
        return response.json()

    def action(self, instance_id: int, action: str) -> dict:
        response = self.api("post", f"instances/{instance_id}/{action}/")
        assert response.status_code in (200, 202), response.text
        return response.json()

    def wait_instance(self, instance_id: int, status: str, timeout: float = 60) -> dict:
        last = {}

        def reached():
            nonlocal last
            last = self.instance(instance_id)
            return last["status"] == status

        try:
            wait_for(reached, timeout=timeout, what=f"instance {instance_id} {status}")
        except AssertionError:
            raise AssertionError(
                f"instance {instance_id} stayed {last.get('status')} ({last.get('status_reason')}); wanted {status}"
            ) from None
        return last

    def release(self, instance_id: int) -> None:
        """Stop (if it runs) and release: the tests leave the cards free for the next one."""
        if self.instance(instance_id)["status"] == "running":
            self.action(instance_id, "stop")
            self.wait_instance(instance_id, "stopped")
        self.action(instance_id, "release")
        self.wait_instance(instance_id, "released")

    # --- where the outcome lives -------------------------------------------------------------
    def sql(self, query: str, params=()) -> list[tuple]:
        with psycopg.connect(self.info["OWNER_DATABASE_URL"], connect_timeout=10) as conn:
            return conn.execute(query, params).fetchall()

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.info["REDIS_URL"], socket_timeout=10)

    def pid(self, name: str) -> int:
        return int(Path(f"/run/gpucloud-{self.prefix}/{name}.pid").read_text())


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "the several-host tests need root (network namespaces, Docker engines)"
    for tool in ("ip", "nsenter", "dockerd", "redis-server", "iptables", "runuser", "curl"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (config/dev/cluster.sh installs what it needs when run as root)"
    return None


@pytest.fixture(scope="session")
def cluster():
    problem = _missing()
    if problem:
        pytest.fail(problem)
    directory = settings.VAR_DIR / "cluster-test"
    env = {
        **os.environ,
        **TIMINGS,
        "CLUSTER_PREFIX": PREFIX,
        "CLUSTER_NET": str(NET),
        "CLUSTER_DIR": str(directory),
        "CLUSTER_WEB_PORT": str(free_port()),
        "PYTHON": sys.executable,
        "WEB_WORKERS": "2",
    }
    c = Cluster(env=env, info={}, tokens={})
    started = time.monotonic()
    try:
        c.script("down", "--purge", timeout=180)  # what an interrupted run left
        c.script("up", str(HOSTS), timeout=420)
        c.info = dict(line.split("=", 1) for line in c.script("env").stdout.splitlines() if "=" in line)
        for line in (directory / "demo-users.txt").read_text().splitlines():
            words = line.split()  # "user demo / demo-pass-123  API token <key>"
            c.tokens[words[1]] = words[-1]
        print(f"cluster up in {time.monotonic() - started:.0f}s", file=sys.stderr)
        yield c
    finally:
        c.script("down", "--purge", timeout=180)
