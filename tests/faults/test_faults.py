"""Fault injection with real processes and signals (docs/reliability.md lists what each shows).

For each fault: the cluster converges within the bound in conftest (two reconciliation
periods past the deadline the fault needs), no container is left running orphaned, no
card is over-allocated, meter segments match the event history of what ran, and no
queued work is lost.
"""

import os
import shutil
import signal
import subprocess
import threading
import time

import pytest
import redis
from django.db import connection, transaction

from agent import launcher
from billing.models import MeterSegment
from scheduler.models import Node, Workload, WorkloadStatus
from scheduler.telemetry import streams
from tests.conftest import url_as, wait_for, wait_status
from tests.faults.conftest import LOST_AFTER_S, dockerd_pid

pytestmark = pytest.mark.django_db(transaction=True)


def running_container(w: Workload):
    return launcher.docker_client().containers.get(w.container_name)


def postgresql(*verb: str) -> None:
    """pg_ctlcluster on the machine's cluster (the one the test database lives in)."""
    version = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=True).stdout.split()[0]
    connection.close()
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", *verb], check=True, timeout=120)
    connection.close()


def assert_node_stays_active(cluster, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert Node.objects.get(name=cluster.node_name).status == "active"
        time.sleep(0.5)


def segment_closed(workload) -> MeterSegment:
    """Its one closed meter segment, once billing has closed it: billing's receiver closes it after the
    transition (or the pause) commits, so the status or event a test waited for may come a moment before."""
    return wait_for(
        lambda: MeterSegment.objects.filter(workload=workload, ended_at__isnull=False).first(),
        timeout=10,
        what="its meter segment to close",
    )


def test_kill_9_of_the_scheduler_worker_in_the_middle_of_a_tick(cluster, catalog):
    node = Node.objects.get(name=cluster.node_name)
    holding, locked = threading.Event(), threading.Event()

    def hold_the_node_row():  # the tick will wait on this lock, half way through its placements
        try:
            with transaction.atomic():
                list(Node.objects.select_for_update().filter(pk=node.pk))
                locked.set()
                holding.wait(60)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_node_row)
    holder.start()
    assert locked.wait(10)
    try:
        w = cluster.create_instance(catalog)

        def tick_waits_on_the_lock():
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
                return cursor.fetchone()[0] > 0

        wait_for(tick_waits_on_the_lock, timeout=20, what="the tick to block in its placement")
        cluster.kill("scheduler")  # kill -9, mid-transaction
    finally:
        holding.set()
        holder.join(10)
    w.refresh_from_db()
    assert w.status == WorkloadStatus.QUEUED  # the killed tick's writes never committed
    cluster.start("scheduler")
    wait_status(w, "running", timeout=30)
    assert w.events.filter(to_status="starting").count() == 1  # placed exactly once
    cluster.wait_converged()


@pytest.mark.alone  # freezes the machine's Docker engine
# A deadline longer than the agent is away, so that what settles the launch is its resend.
@pytest.mark.parametrize("cluster_env", [{"TRANSITION_DEADLINE_S": "60"}])
def test_kill_9_of_the_node_agent_in_the_middle_of_a_launch(cluster, catalog):
    dockerd = dockerd_pid()
    r = cluster.redis()
    queue = Node.objects.get(name=cluster.node_name).queue
    try:
        os.kill(dockerd, signal.SIGSTOP)  # every Docker call of the agent now hangs
        w = cluster.create_instance(catalog)
        wait_status(w, "starting", timeout=30)
        wait_for(lambda: r.llen(queue) == 0, timeout=20, what="the agent to take the launch")
        cluster.kill("agent")
    finally:
        os.kill(dockerd, signal.SIGCONT)
    cluster.start("agent")
    # The launch it died in is sent again (it stayed starting past LAUNCH_RESEND_S) and the new agent
    # runs it: the instance runs, once, instead of failing at the deadline.
    wait_for(lambda: w.refresh_from_db() or w.status != "starting", timeout=30, what="the launch to be settled")
    assert w.status == WorkloadStatus.RUNNING, w.status_reason
    assert len(launcher.containers_on_node(cluster.node_name)) == 1
    cluster.wait_converged()


@pytest.mark.alone  # freezes the machine's Docker engine
def test_kill_9_of_the_node_agent_in_the_middle_of_a_stop(cluster, catalog):
    w = cluster.create_instance(catalog)
    wait_status(w, "running", timeout=30)
    dockerd = dockerd_pid()
    try:
        os.kill(dockerd, signal.SIGSTOP)
        assert cluster.api("post", f"instances/{w.instance.pk}/stop/").status_code == 202
        r = cluster.redis()
        queue = Node.objects.get(name=cluster.node_name).queue
        wait_for(lambda: r.llen(queue) == 0, timeout=20, what="the agent to take the stop")
        cluster.kill("agent")
    finally:
        os.kill(dockerd, signal.SIGCONT)
    cluster.start("agent")
    wait_status(w, "stopped", timeout=30)
    assert not running_container(w).attrs["State"]["Running"]
    cluster.wait_converged()


def test_the_clusters_redis_refuses_clients_without_its_password(cluster):
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=cluster.redis_port).ping()
    assert cluster.redis().ping()


def test_docker_kill_of_a_container(cluster, catalog):
    w = cluster.create_instance(catalog)
    wait_status(w, "running", timeout=30)
    running_container(w).kill()
    wait_status(w, "failed", timeout=15)
    assert "137" in w.status_reason
    cluster.wait_converged()


def test_a_silent_node_agent_is_lost_and_when_it_speaks_again_keeps_its_instance_and_gives_up_the_job(cluster, catalog):
    instance = cluster.create_instance(catalog)
    job = cluster.create_job(catalog, "sleep 600")
    wait_status(instance, "running", timeout=30)
    wait_status(job, "running", timeout=30)
    cluster.signal("agent", signal.SIGSTOP)  # no heartbeat, no reconcile: a frozen agent
    try:
        wait_for(
            lambda: Node.objects.get(name=cluster.node_name).status == "lost",
            timeout=LOST_AFTER_S + 15,
            what="the node to be lost",
        )
        wait_for(lambda: job.refresh_from_db() or job.status == "queued", timeout=10, what="the job's requeue")
        instance.refresh_from_db()
        assert instance.status == "running"  # the host still runs it, uncharged from its last heartbeat
        # Paused at the host's last heartbeat (or at the instance's own last event, where that came later).
        last_heard = max(
            Node.objects.get(name=cluster.node_name).last_heartbeat,
            instance.events.exclude(meter="pause").latest("created_at", "id").created_at,
        )
        pause = wait_for(lambda: instance.events.filter(meter="pause").first(), timeout=10, what="the meter to pause")
        assert pause.created_at == last_heard == segment_closed(instance).ended_at
        assert running_container(instance).attrs["State"]["Running"]
    finally:
        cluster.signal("agent", signal.SIGCONT)
    # It speaks again: it fences itself (stops the job it no longer owns), keeps the instance, rejoins,
    # and takes the job back.
    wait_status(job, "running", timeout=30)
    instance.refresh_from_db()
    assert instance.status == "running" and running_container(instance).attrs["State"]["Running"]
    wait_for(
        lambda: MeterSegment.objects.filter(workload=instance).count() == 2, timeout=10, what="the meter to resume"
    )
    first, again = MeterSegment.objects.filter(workload=instance).order_by("started_at")
    assert first.ended_at == last_heard and again.ended_at is None  # charged again since the host is back
    assert again.started_at == instance.events.get(meter="resume").created_at > last_heard
    cluster.wait_converged()


@pytest.mark.parametrize("offset", ["-40s", "+40s"])
def test_a_node_agent_whose_clock_is_40_seconds_off_is_not_lost_and_meters_on_the_databases_clock(
    cluster, catalog, offset
):
    assert shutil.which("faketime"), "faketime is missing: apt-get install faketime (make test installs it)"
    cluster.kill("agent", signal.SIGTERM)
    # Its wall clock is off; its monotonic clock runs true, as on a real host (and thread waits need it).
    # "-m": libfaketime's multi-threaded build. The agent runs threads; under the default build it died of a
    # segmentation fault at start once in a full run, and libfaketime's maintainers point threaded programs
    # to the MT build.
    cluster.wrap["agent"] = ["env", "FAKETIME_DONT_FAKE_MONOTONIC=1", "faketime", "-m", "-f", offset]
    cluster.start("agent")
    wait_for(lambda: Node.objects.get(name=cluster.node_name).epoch >= 2, timeout=30, what="the skewed agent")
    instance = cluster.create_instance(catalog)
    wait_status(instance, "running", timeout=30)
    # Longer than the lost-node limit: heartbeats written on the database's clock keep it active.
    assert_node_stays_active(cluster, LOST_AFTER_S + 4)
    assert cluster.api("post", f"instances/{instance.instance.pk}/stop/").status_code == 202
    wait_status(instance, "stopped", timeout=30)
    segment = segment_closed(instance)
    assert segment.ended_at > segment.started_at
    assert LOST_AFTER_S < (segment.ended_at - segment.started_at).total_seconds() < LOST_AFTER_S + 30
    cluster.wait_converged()


@pytest.mark.alone  # stops the machine's PostgreSQL
def test_the_control_plane_down_two_minutes_loses_no_node_and_fails_no_instance(cluster, catalog):
    instance = cluster.create_instance(catalog)
    job = cluster.create_job(catalog, "sleep 600")
    wait_status(instance, "running", timeout=30)
    wait_status(job, "running", timeout=30)
    postgresql("stop", "-m", "fast")
    try:
        time.sleep(120)  # the outage itself: two minutes without the database, heartbeats and beat failing
    finally:
        postgresql("start")
    wait_for(lambda: cluster.api("get", "instances/").status_code == 200, timeout=60, what="the API")
    # Agents heartbeat again before the control plane, watching afresh, could call them lost.
    assert_node_stays_active(cluster, LOST_AFTER_S + 4)
    instance.refresh_from_db()
    assert instance.status == "running" and running_container(instance).attrs["State"]["Running"]
    assert MeterSegment.objects.filter(workload=instance).count() == 1  # one run, metered throughout
    # The job was stopped by its own node when contact was lost (it cannot tell an outage from a cut
    # network), requeued to resume from its checkpoint there, and runs again.
    wait_status(job, "running", timeout=30)
    assert job.events.filter(reason__contains="lost contact with the control plane").exists()
    cluster.wait_converged()


# A deadline well past the resend, so that the test shows the resend, not a race with the deadline.
@pytest.mark.parametrize("cluster_env", [{"TRANSITION_DEADLINE_S": "30"}])
def test_a_launch_whose_message_was_lost_is_sent_again_not_failed(cluster, catalog):
    cluster.signal("agent", signal.SIGSTOP)  # the launch message waits in Redis, unread
    try:
        w = cluster.create_instance(catalog)
        wait_status(w, "starting", timeout=15)
        wait_for(lambda: cluster.redis().llen(f"node.{cluster.node_name}") > 0, timeout=10, what="the message")
        cluster.redis().delete(f"node.{cluster.node_name}")  # ... and is lost (a Redis restart without it)
    finally:
        cluster.signal("agent", signal.SIGCONT)
    wait_status(w, "running", timeout=30)
    assert not w.events.filter(to_status="failed").exists()
    cluster.wait_converged()


def test_restarting_redis_while_instances_run(cluster, catalog):
    w = cluster.create_instance(catalog)
    wait_status(w, "running", timeout=30)
    cluster.kill("redis", signal.SIGTERM)
    cluster.start("redis")
    started = time.monotonic()
    # The cluster's processes reconnect to the new Redis and go on: a stop reaches the agent.
    wait_for(
        lambda: cluster.api("post", f"instances/{w.instance.pk}/stop/").status_code == 202,
        timeout=30,
        what="the API to accept a stop after the restart",
    )
    wait_status(w, "stopped", timeout=30)
    assert time.monotonic() - started < 60
    cluster.wait_converged()
    second = cluster.create_instance(catalog)  # queued work placed after the restart
    wait_status(second, "running", timeout=30)
    cluster.wait_converged()


@pytest.mark.alone  # stops the machine's PostgreSQL
def test_restarting_postgresql_while_instances_run(cluster, catalog):
    w = cluster.create_instance(catalog)
    job = cluster.create_job(catalog, "sleep 600")
    wait_status(w, "running", timeout=30)
    wait_status(job, "running", timeout=30)
    postgresql("restart")
    # Every process reconnects: heartbeats go on (the node is not lost), the API answers, a stop works.
    wait_for(
        lambda: cluster.api("post", f"instances/{w.instance.pk}/stop/").status_code == 202,
        timeout=30,
        what="the API to accept a stop after the restart",
    )
    wait_status(w, "stopped", timeout=30)
    wait_status(job, "running", timeout=30)  # still, or again if the restart outlasted the self-fence
    assert Node.objects.get(name=cluster.node_name).status == "active"
    cluster.wait_converged()


@pytest.mark.alone  # restarts the machine's Docker engine
def test_restarting_dockerd_while_instances_run(cluster, catalog):
    """What the engine's restart does to an instance follows its ``--live-restore`` (config/dev/services.sh
    starts it with the option, an engine already running is kept as it is): with it the container outlives the
    engine and the instance stays RUNNING; without it the container stops and reconciliation says so.
    tests/agent/test_live_restore.py runs both on engines of its own."""
    live_restore = launcher.docker_client().info()["LiveRestoreEnabled"]
    w = cluster.create_instance(catalog)
    wait_status(w, "running", timeout=30)
    container_pid = launcher.docker_client().containers.get(w.container_name).attrs["State"]["Pid"]
    pid = dockerd_pid()
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        command = [part.decode() for part in f.read().split(b"\0") if part]
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), timeout=60, what="dockerd to stop")
    log = open(cluster.logs + "/dockerd-restarted.log", "a")  # noqa: SIM115  (kept by dockerd)
    subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for(
        lambda: subprocess.run(["docker", "info"], capture_output=True).returncode == 0,
        timeout=60,
        what="dockerd to come back",
    )
    launcher.docker_client.cache_clear()
    if live_restore:
        # The same process, still running; the agent reconciles against the engine that is back and changes
        # nothing; the instance stops when asked.
        container = launcher.docker_client().containers.get(w.container_name)
        assert (container.status, container.attrs["State"]["Pid"]) == ("running", container_pid)
        cluster.wait_converged()
        w.refresh_from_db()
        assert w.status == "running", w.status_reason
        assert not w.events.filter(to_status__in=["stopped", "failed"]).exists()
        assert cluster.api("post", f"instances/{w.instance.pk}/stop/").status_code == 202
        wait_status(w, "stopped", timeout=30)
        cluster.wait_converged()
        return
    # Its containers stopped with the engine: reconciliation says so, and the instance starts again.
    wait_for(lambda: w.refresh_from_db() or w.status != "running", timeout=30, what="the stop to be noticed")
    assert w.status in ("stopped", "failed") and "container exited" in w.status_reason
    cluster.wait_converged()
    assert cluster.api("post", f"instances/{w.instance.pk}/start/").status_code == 202
    wait_status(w, "running", timeout=30)
    cluster.wait_converged()


def test_a_node_agent_runs_its_whole_lifecycle_on_its_least_privilege_database_role(roles, cluster, catalog):
    # ``roles`` comes first, so it is dropped only after the cluster (and its agent) has stopped.
    cluster.kill("agent", signal.SIGTERM)
    cluster.env_for["agent"] = {"DATABASE_URL": url_as(roles.node(cluster.node_name), "node-pw")}
    epoch = Node.objects.get(name=cluster.node_name).epoch
    cluster.start("agent")  # registers (a new epoch), fences, heartbeats: as the node role
    wait_for(lambda: Node.objects.get(name=cluster.node_name).epoch > epoch, timeout=30, what="the agent to register")
    instance = cluster.create_instance(catalog)
    job = cluster.create_job(catalog, "sleep 1; echo done")
    wait_status(instance, "running", timeout=30)
    stream = streams.workload_stream(cluster.node_name, instance.pk)
    wait_for(lambda: cluster.redis().xlen(stream) >= 2, timeout=20, what="GPU samples taken as the node role")
    wait_status(job, "succeeded", timeout=30)
    assert cluster.api("post", f"instances/{instance.instance.pk}/stop/").status_code == 202
    wait_status(instance, "stopped", timeout=30)
    cluster.wait_converged()
    # Billing followed, written by the agent as the node role: the database's checks on what a host bills
    # (db_roles' EVENT_TIME, SEGMENT_OPENED) let exactly the agent's own writes through. (A refused write is
    # logged by the agent and its segment missing here, unless the control plane's minute reconcile repaired it:
    # the log is read too.)
    for workload in (instance, job):
        started = workload.events.get(to_status="running").created_at
        assert list(MeterSegment.objects.filter(workload=workload).values_list("started_at", flat=True)) == [started]
        assert MeterSegment.objects.get(workload=workload).ended_at is not None
    agent_log = open(cluster.log_path("agent")).read()
    assert "row-level security" not in agent_log, agent_log[-3000:]
