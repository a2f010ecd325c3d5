"""Fixtures on real services: PostgreSQL (in CI), Redis, a Celery worker, Docker.

A missing service ends the run with an error; nothing is skipped for it.
"""

import contextlib
import gc
import importlib
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

import pytest
import redis
from django.conf import settings
from django.db import connection
from rest_framework.test import APIClient

from agent.gpus import simulated_inventory
from agent.images import stand_in_ensure
from agent.launcher import LABEL, docker_client
from portal.models import GpuType
from portal.services.demo import STANDIN_IMAGE, catalog_load, stand_in_load
from scheduler.services.nodes import node_register
from tests.ports import free_port

TEST_IMAGE = STANDIN_IMAGE  # tests that need a container but no framework: the tiny BusyBox stand-in
NO_DOCKER = "unix:///nonexistent/docker.sock"  # the web tier's Docker engine: none


@pytest.fixture(scope="session", autouse=True)
def real_services(django_db_setup, django_db_blocker):
    """Redis and Docker must answer (and PostgreSQL in CI): a missing one fails the run."""
    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_timeout=3).ping()
    except redis.RedisError as exc:
        pytest.exit(f"Redis is not reachable at {settings.REDIS_URL} ({exc}): run `make test`, which starts it", 3)
    try:
        docker_client().ping()
    except Exception as exc:
        pytest.exit(f"the Docker engine is not reachable ({exc}): run `make test`, which starts it", 3)
    if os.environ.get("CI") and connection.vendor != "postgresql":
        pytest.exit("CI must run the suite on PostgreSQL: set DATABASE_URL", 3)
    settings.SCHEDULER_QUEUE = f"scheduler-test-{uuid.uuid4().hex[:8]}"
    settings.DEPLOYMENT_ID = f"test-{uuid.uuid4().hex[:8]}"  # never the dev deployment's volumes
    yield
    from scheduler import beside

    beside.close()  # the tick's second connection, before the test database is dropped
    # Connections dropped in reference cycles that a tick froze (``core.memory``) close only when collected: now,
    # before the database is dropped, not at the next unfreeze (PostgreSQL refuses to drop a database in use).
    gc.unfreeze()
    gc.collect()
    redis.Redis.from_url(settings.REDIS_URL).delete(settings.SCHEDULER_QUEUE)
    client = docker_client()
    for container in client.containers.list(
        all=True, filters={"label": f"{LABEL}.deployment={settings.DEPLOYMENT_ID}"}
    ):
        container.remove(force=True)
    for volume in client.volumes.list(filters={"label": f"{LABEL}.deployment={settings.DEPLOYMENT_ID}"}):
        volume.remove(force=True)


@pytest.fixture(autouse=True)
def fresh_pins():
    """Each test reads its engine's pinned cores afresh, as an agent does when it starts (containers an earlier
    test removed behind the agent's back are not counted)."""
    from agent import hostview

    hostview.pins.forget()


@pytest.fixture(autouse=True)
def fresh_mix():
    """Each test's tick reads the task mix of its own submissions, as a scheduler worker does when it starts (it keeps
    one for a minute): a mix an earlier test left would steer FGD's choices."""
    from scheduler import tick

    tick.mix_forget()


@pytest.fixture(autouse=True)
def fresh_throttles(monkeypatch):
    """Each test counts its own requests: throttle state never leaks from one test into the next."""
    from django.core.cache.backends.locmem import LocMemCache
    from rest_framework.throttling import SimpleRateThrottle

    monkeypatch.setattr(SimpleRateThrottle, "cache", LocMemCache(f"throttles-{uuid.uuid4().hex}", {}))


@pytest.fixture(scope="session")
def base_image():
    stand_in_ensure(TEST_IMAGE)
    return TEST_IMAGE


@pytest.fixture
def catalog(db):
    catalog_load()
    return {
        "rtx3090": GpuType.objects.get(name="RTX3090"),
        "a100": GpuType.objects.get(name="A100-80GB"),
        "h100": GpuType.objects.get(name="H100"),
        "image": stand_in_load(),
    }


def make_node(
    spec: str = "sim:2xRTX3090,1xA100-80GB", *, cpu_cores: int = 8, memory_mb: int = 16384, disk_gb: int | None = None
):
    name = f"test-{uuid.uuid4().hex[:8]}"
    return node_register(
        name=name,
        hostname="testhost",
        cpu_cores=cpu_cores,
        memory_mb=memory_mb,
        disk_gb=disk_gb,
        gpus=simulated_inventory(spec, name),
        simulated=True,
        nvidia_runtime=False,
    )


def remove_node_containers(node_name: str) -> None:
    client = docker_client()
    for container in client.containers.list(all=True, filters={"label": f"{LABEL}.node={node_name}"}):
        container.remove(force=True)
    for volume in client.volumes.list(filters={"label": f"{LABEL}.node={node_name}"}):
        volume.remove(force=True)


@pytest.fixture
def cluster_env() -> dict:
    """Extra settings for the real-process cluster (tests/faults/conftest.py); a test module overrides it."""
    return {}


@pytest.fixture
def sim_node(db):
    node = make_node()
    yield node
    remove_node_containers(node.name)


@pytest.fixture
def node_relay(sim_node):
    """The node's relay, as its agent runs it (a thread), on a free loopback port and registered for the node."""
    from agent.relay.server import RelayServer

    relay = RelayServer(sim_node.name, api=docker_client().api, host="127.0.0.1", port=0)
    sim_node.relay_url, sim_node.relay_tls_sha256 = relay.start(), relay.tls_sha256
    sim_node.save(update_fields=["relay_url", "relay_tls_sha256"])
    yield relay
    relay.stop()


@pytest.fixture
def node_worker(transactional_db, sim_node, node_relay, base_image):
    """A real Celery worker on Redis serving the scheduler queue and the node's queue, and the node's relay."""
    with worker_for(sim_node):
        yield sim_node


@contextlib.contextmanager
def worker_for(*nodes):
    """A real Celery worker on Redis serving the scheduler queue and the queues (and slow queues) of ``nodes``."""
    from celery.contrib.testing.worker import start_worker
    from celery.signals import task_postrun

    from agent.celery import app  # the control plane's tasks and this host's

    def close_connection(**kwargs):
        connection.close()

    task_postrun.connect(close_connection, weak=False)
    try:
        with start_worker(
            app,
            pool="threads",
            concurrency=2,
            queues=[settings.SCHEDULER_QUEUE, *(q for node in nodes for q in (node.queue, node.slow_queue))],
            perform_ping_check=False,
            shutdown_timeout=20,
        ):
            yield
    finally:
        task_postrun.disconnect(close_connection)


def wait_for(predicate, *, timeout: float = 30, what: str = "condition", poke=None):
    """Poll ``predicate`` until it is true; ``poke`` runs between polls (e.g. the node's reconcile step)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if poke is not None:
            poke()
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_status(workload, status: str, timeout: float = 30, poke=None):
    def reached():
        workload.refresh_from_db()
        return workload.status == status

    try:
        wait_for(reached, timeout=timeout, what=f"status {status}", poke=poke)
    except AssertionError:
        history = "; ".join(
            f"{e.from_status}->{e.to_status} ({e.reason})" for e in workload.events.order_by("created_at", "id")
        )
        raise AssertionError(
            f"workload stayed {workload.status} ({workload.status_reason}); wanted {status}. History: {history}"
        ) from None
    return workload


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("alice", password="alice-pass-123")


@pytest.fixture
def may_submit_high(user):
    """``user`` allowed to submit work at high priority, as an administrator allows it."""
    from django.contrib.auth.models import Permission

    user.user_permissions.add(Permission.objects.get(codename="submit_high_priority"))
    return user


def staff_member(django_user_model, username: str, group: str):
    """A staff account in one of the staff groups (portal migration 0012: "Support", "Operators", "Billing"). The
    group is made again where a transactional test's flush took it (its permissions come back with post_migrate)."""
    from django.contrib.auth.models import Group, Permission

    groups = importlib.import_module("portal.migrations.0012_staff_groups").GROUPS
    made, _ = Group.objects.get_or_create(name=group)
    for app_label, _model, codename in groups[group]:
        made.permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    person = django_user_model.objects.create_user(username, password=f"{username}-pass-123", is_staff=True)
    person.groups.add(made)
    return person


@pytest.fixture
def outsider(django_user_model):
    return django_user_model.objects.create_user("mallory", password="mallory-pass-123")


@pytest.fixture
def api(user):
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def outsider_api(outsider):
    client = APIClient()
    client.force_authenticate(outsider)
    return client


def database_url() -> str:
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def url_as(role: str, password: str) -> str:
    """The test database's URL, logging in as ``role``."""
    return f"postgres://{role}:{password}@{database_url().split('@', 1)[1]}"


ROLES_SCRIPT = settings.BASE_DIR / "config" / "prod" / "images" / "postgres-roles.sh"


def roles_script(**env: str) -> subprocess.CompletedProcess:
    """postgres-roles.sh, production's only way to make the platform's login roles, run on the test database as
    its superuser with ``env`` (DB_ROLES_PREFIX, DB_WEB_PASSWORD, DB_NODE_ROLES, ...)."""
    db = connection.settings_dict
    base = {
        "PATH": "/usr/bin:/bin",
        "PSQL": f"psql -h {db['HOST'] or '127.0.0.1'} -p {db['PORT'] or 5432} -U postgres",
        "POSTGRES_USER": db["USER"],
        "POSTGRES_DB": db["NAME"],
    }
    return subprocess.run(["sh", str(ROLES_SCRIPT)], env={**base, **env}, capture_output=True, text=True)


@dataclass
class Roles:
    """The least-privilege roles of one test, passwords "web-pw" and "node-pw": made by the database server's
    script (postgres-roles.sh), granted their tables by manage.py db_roles, as in production."""

    prefix: str
    web: str
    hosts: list[str]
    idle_tx_s: int = 30  # NODE_DB_IDLE_TX_S: a host's session idle inside a transaction this long is ended

    def node(self, node_name: str) -> str:
        """The login role of host ``node_name``'s agent, created on first use."""
        from scheduler.management.commands.db_roles import node_role

        if node_name not in self.hosts:
            self.hosts.append(node_name)
            self.make()
        return node_role(self.prefix, node_name)

    def drop(self, node_name: str) -> None:
        """Host ``node_name`` taken off the list: its role may no longer log in."""
        self.hosts.remove(node_name)
        self.make()

    def make(self) -> None:
        done = roles_script(
            DB_ROLES_PREFIX=self.prefix,
            DB_WEB_PASSWORD="web-pw",
            DB_NODE_ROLES=" ".join(f"{name}=node-pw" for name in self.hosts),
            NODE_DB_IDLE_TX_S=str(self.idle_tx_s),
        )
        assert done.returncode == 0, done.stderr


@pytest.fixture
def roles(transactional_db):
    """The least-privilege roles under a fresh prefix, granted their tables; dropped afterwards."""
    from django.core.management import call_command

    if connection.vendor != "postgresql":
        pytest.fail("run on PostgreSQL (make test does)")
    prefix = f"gpuc_{uuid.uuid4().hex[:6]}"
    made = Roles(prefix=prefix, web=f"{prefix}_web", hosts=[])
    made.make()
    call_command("db_roles", prefix=prefix)
    yield made
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT rolname FROM pg_roles WHERE starts_with(rolname, %s) ORDER BY length(rolname) DESC", [prefix]
        )
        for (role,) in cursor.fetchall():
            cursor.execute(f'DROP OWNED BY "{role}"')
            cursor.execute(f'DROP ROLE "{role}"')


@pytest.fixture
def web_server(transactional_db):
    """daphne serving config.asgi on a free loopback port, on the test database; yields "127.0.0.1:<port>".

    As in production, it has no Docker engine to talk to: terminals go through the node's relay.
    """
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "SCHEDULER_QUEUE": settings.SCHEDULER_QUEUE,
        "DEPLOYMENT_ID": settings.DEPLOYMENT_ID,
        "CACHE_KEY_PREFIX": f"{settings.DEPLOYMENT_ID}-{port}",  # its own throttle counts
        "DOCKER_BASE_URL": NO_DOCKER,
    }
    log_path = settings.VAR_DIR / "log" / f"test-daphne-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")  # noqa: SIM115  (closed in finally)
    process = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def listening():
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(listening, timeout=30, what="daphne to listen")
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:  # daphne waits for open WebSockets (a browser's) to close before it exits: not forever
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()


@pytest.fixture(autouse=True)
def signup_credit(settings):
    """Users the tests make start with a credit (as with SIGNUP_CREDIT set), so their work may start.

    Billing tests that need an empty wallet set ``settings.SIGNUP_CREDIT = "0"`` first.
    """
    settings.SIGNUP_CREDIT = "1000"
