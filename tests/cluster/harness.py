"""A several-host cluster brought up by ``config/dev/cluster.sh`` on an instance of its address plan
of the caller's choosing, and a client for it: the HTTP API as a user, each host's Docker engine
(its own socket), and the cluster's own PostgreSQL and Redis.

No Django here: the tests (``tests/cluster/conftest.py``) and the benchmarks (``bench/``) share it.
Needs root, as the script does.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import docker
import psycopg
import redis
import requests

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "config" / "dev" / "cluster.sh"
IMAGE = "gpucloud/busybox-standin:latest"  # load_demo --stand-in: sh, nc and sleep, a few MB


class ClusterError(RuntimeError):
    """The script failed; the message holds its output."""


# What a user types to start one process per card on each member (the platform's contract).
GANG_TORCHRUN = (
    "--nnodes $NNODES --node-rank $NODE_RANK --nproc-per-node $NPROC_PER_NODE "
    "--master-addr $MASTER_ADDR --master-port $MASTER_PORT"
)


def uploaded(path: Path, then: str) -> str:
    """A job's command that writes the file ``path`` into /tmp/job (as ``--upload`` would put it in the job's
    folder) and runs ``then`` there."""
    code = base64.b64encode(path.read_bytes()).decode()
    return f"mkdir -p /tmp/job && cd /tmp/job && echo {code} | base64 -d > {path.name} && {then}"


def wait_until(predicate, *, timeout: float, what: str, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Cluster:
    """A cluster of prefix ``prefix`` on 10.<net>.0.0/24 (hosts), 10.<net+1> (engines), 10.<net+2> (tenants)."""

    prefix: str
    net: int
    directory: Path
    settings: dict = field(default_factory=dict)  # platform settings for every process (timings, ...)
    info: dict = field(default_factory=dict)  # cluster.sh env: URLs and secrets of the control plane
    tokens: dict = field(default_factory=dict)  # demo user name -> API token

    @cached_property
    def env(self) -> dict:
        return {
            **os.environ,
            **self.settings,
            "CLUSTER_PREFIX": self.prefix,
            "CLUSTER_NET": str(self.net),
            "CLUSTER_DIR": str(self.directory),
            "CLUSTER_WEB_PORT": str(free_port()),
            "PYTHON": sys.executable,
        }

    # --- its script ------------------------------------------------------------------------
    def script(self, *args: str, timeout: float = 300) -> str:
        result = subprocess.run(
            ["bash", str(SCRIPT), *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0:
            raise ClusterError(
                f"cluster.sh {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
            )
        return result.stdout

    def up(self, hosts: int) -> Cluster:
        """Bring it up afresh (whatever an interrupted run left is removed first)."""
        self.script("down", "--purge", timeout=180)
        self.script("up", str(hosts), timeout=600)
        self.info = dict(line.split("=", 1) for line in self.script("env").splitlines() if "=" in line)
        for line in (self.directory / "demo-users.txt").read_text().splitlines():
            words = line.split()  # "user demo / demo-pass-123  API token <key>"
            self.tokens[words[1]] = words[-1]
        return self

    def down(self) -> None:
        self.script("down", "--purge", timeout=180)

    def add_host(self, i: int, cards: str) -> None:
        self.script("add-host", str(i), cards, timeout=180)

    # --- the address plan --------------------------------------------------------------------
    def host_address(self, i: int) -> str:
        return f"10.{self.net}.0.{10 + i}"

    def host_netns(self, i: int) -> str:
        return f"/var/run/netns/{self.prefix}h{i}"

    def tenant_subnet(self, i: int) -> str:
        return f"10.{self.net + 2}.{i}.0/24"

    def engine(self, i: int) -> docker.DockerClient:
        return docker.DockerClient(base_url=f"unix:///run/gpucloud-{self.prefix}/h{i}.sock", timeout=60)

    def pid(self, name: str) -> int:
        return int(Path(f"/run/gpucloud-{self.prefix}/{name}.pid").read_text())

    # --- as a user, over HTTP ----------------------------------------------------------------
    def api(self, method: str, path: str, *, user: str = "demo", **kwargs) -> requests.Response:
        return requests.request(
            method,
            f"{self.info['WEB_URL']}/api/v1/{path}",
            headers={"Authorization": f"Token {self.tokens[user]}"},
            timeout=60,
            **kwargs,
        )

    @cached_property
    def catalog(self) -> dict:
        """GPU type ids by name, the id of the test image, and every image's id by its reference without the
        registry (read once; ``catalog_forget`` after a change)."""
        types = {t["name"]: t["id"] for t in self.api("get", "gpu-types/").json()["results"]}
        # The catalog names its registry (REGISTRY/gpucloud/pytorch:...).
        images = {
            i["docker_ref"].split("/", 1)[-1] if "." in i["docker_ref"].split("/")[0] else i["docker_ref"]: i["id"]
            for i in self.api("get", "images/").json()["results"]
        }
        return {"gpu_types": types, "image": images[IMAGE], "images": images}

    def catalog_forget(self) -> None:
        self.__dict__.pop("catalog", None)

    def work_body(self, gpu_type: str, gpus: float | str = 1, **fields) -> dict:
        catalog = self.catalog
        body = {
            "image": catalog["image"],
            "gpu_type": str(catalog["gpu_types"][gpu_type]),
            "gpus": str(gpus),
            "cpu_cores": 1,
            "memory_gb": 1,
        }
        return body | fields

    def job_ended(self, job_id: int, timeout: float) -> tuple[dict, list[dict]]:
        """Wait for the job to end; its last state and its log's records (NDJSON: line, rank, host, ...)."""

        def ended():
            state = self.api("get", f"jobs/{job_id}/").json()
            return state if state["status"] in ("succeeded", "failed", "cancelled") else None

        done = wait_until(ended, timeout=timeout, what=f"job {job_id} to end", every=1)
        log = self.api("get", f"jobs/{job_id}/logs/", params={"format": "ndjson"}).text
        return done, [json.loads(line) for line in log.splitlines()]

    def create_instance(self, gpu_type: str, gpus: float | str = 1) -> dict:
        response = self.api("post", "instances/", json=self.work_body(gpu_type, gpus, disk_gb=5))
        if response.status_code != 201:
            raise AssertionError(f"create answered {response.status_code}: {response.text}")
        return response.json()

    def instance(self, instance_id: int) -> dict:
        response = self.api("get", f"instances/{instance_id}/")
        if response.status_code != 200:
            raise AssertionError(f"instance {instance_id} answered {response.status_code}: {response.text}")
        return response.json()

    def action(self, instance_id: int, action: str) -> dict:
        response = self.api("post", f"instances/{instance_id}/{action}/")
        if response.status_code not in (200, 202):
            raise AssertionError(f"{action} of {instance_id} answered {response.status_code}: {response.text}")
        return response.json()

    def wait_instance(self, instance_id: int, status: str, timeout: float = 60, every: float = 0.2) -> dict:
        last = {}

        def reached():
            nonlocal last
            last = self.instance(instance_id)
            return last["status"] == status

        try:
            wait_until(reached, timeout=timeout, what=f"instance {instance_id} {status}", every=every)
        except AssertionError:
            raise AssertionError(
                f"instance {instance_id} stayed {last.get('status')} ({last.get('status_reason')}); wanted {status}"
            ) from None
        return last

    def release(self, instance_id: int) -> None:
        """Stop (if it runs) and release it, so its cards are free again."""
        if self.instance(instance_id)["status"] == "running":
            self.action(instance_id, "stop")
            self.wait_instance(instance_id, "stopped")
        self.action(instance_id, "release")
        self.wait_instance(instance_id, "released")

    def stop_everything(self, timeout: float = 180) -> list[str]:
        """After a test that failed midway: its owners stop every instance and job still queued or holding cards
        (what a later test needs free), as a user would; returns what was stopped."""
        live = "('queued', 'starting', 'running', 'stopping')"
        rows = self.sql(
            "SELECT i.id, j.id, u.username FROM scheduler_workload w JOIN auth_user u ON u.id = w.owner_id "
            "LEFT JOIN portal_instance i ON i.workload_id = w.id LEFT JOIN portal_job j ON j.workload_id = w.id "
            f"WHERE w.status IN {live} ORDER BY w.id"
        )
        stopped = []
        for instance_id, job_id, user in rows:
            if instance_id is not None:
                self.api("post", f"instances/{instance_id}/stop/", user=user)
                stopped.append(f"instance {instance_id}")
            elif job_id is not None:
                self.api("post", f"jobs/{job_id}/cancel/", user=user)
                stopped.append(f"job {job_id}")
        wait_until(
            lambda: not self.sql(f"SELECT 1 FROM scheduler_workload WHERE status IN {live}"),
            timeout=timeout,
            what=f"{', '.join(stopped)} to stop",
        )
        return stopped

    # --- where the outcome lives -------------------------------------------------------------
    def sql(self, query: str, params=()) -> list[tuple]:
        with psycopg.connect(self.info["OWNER_DATABASE_URL"], connect_timeout=10) as conn:
            cursor = conn.execute(query, params)
            return cursor.fetchall() if cursor.description else []

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.info["REDIS_URL"], socket_timeout=10)
