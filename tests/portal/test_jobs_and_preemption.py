"""Batch jobs and preemption on a real worker and real containers."""

import contextlib
import threading

import pytest
from django.db import connection

from agent.launcher import docker_client
from agent.reconcile import agent_reconcile, watch_container_exits
from billing.models import MeterSegment
from portal.models import Instance, Job
from scheduler.models import Workload
from tests.conftest import TEST_IMAGE, wait_status

pytestmark = pytest.mark.django_db(transaction=True)

TRAINER = r"""
ckpt=$GPUCLOUD_CHECKPOINT_DIR/step
n=$(cat $ckpt 2>/dev/null || echo 0)
trap 'echo $n > $ckpt; echo "checkpointed at $n"; exit 143' TERM
echo "start at $n, resume $GPUCLOUD_RESUME_COUNT, world $WORLD_SIZE, master $MASTER_ADDR:$MASTER_PORT"
while [ $n -lt 25 ]; do n=$((n+1)); sleep 0.2; done
echo "done at $n"
"""


def submit_job(api, catalog, **overrides):
    body = {
        "name": "train",
        "image": catalog["image"].pk,
        "gpu_type": catalog["rtx3090"].pk,
        "gpus": "1",
        "command": "echo hello",
        "cpu_cores": 1,
        "memory_gb": 1,
    }
    response = api.post("/api/v1/jobs/", body | overrides, format="json")
    assert response.status_code == 201, response.data
    return Job.objects.get(pk=response.data["id"])


def read_volume(volume: str, path: str) -> str:
    out = docker_client().containers.run(
        TEST_IMAGE,
        ["cat", f"/v/{path}"],
        volumes={volume: {"bind": "/v", "mode": "ro"}},
        remove=True,
        network_mode="none",
    )
    return out.decode().strip()


def reconcile(node):
    def poke():
        try:
            agent_reconcile(node.name)
        finally:
            connection.close()

    return poke


def test_a_job_runs_to_completion_and_keeps_exit_code_logs_and_its_distributed_env(api, catalog, node_worker):
    job = submit_job(
        api,
        catalog,
        gpus="2",
        command='echo "world=$WORLD_SIZE at $MASTER_ADDR:$MASTER_PORT resume=$GPUCLOUD_RESUME_COUNT"; exit 3',
    )
    wait_status(job.workload, "failed", poke=reconcile(node_worker))
    data = api.get(f"/api/v1/jobs/{job.pk}/").data
    assert data["exit_code"] == 3 and "code 3" in data["status_reason"]
    assert "world=2 at 127.0.0.1:29500 resume=0" in data["log_tail"]
    assert data["started_at"] and data["finished_at"]
    assert not job.workload.allocations.exists()


@contextlib.contextmanager
def exit_watcher(node):
    """The node agent's Docker-events watcher, running beside the test."""
    stop = threading.Event()
    watcher = threading.Thread(target=watch_container_exits, args=(node.name, stop), daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        # One more container event lets the watcher see ``stop``.
        docker_client().containers.run(
            TEST_IMAGE, ["true"], remove=True, network_mode="none", labels={"gpucloud.node": node.name}
        )
        watcher.join(10)


def test_a_job_over_its_maximum_runtime_is_stopped_and_says_so_even_when_the_exit_watcher_sees_the_exit_first(
    api, catalog, node_worker, settings, monkeypatch
):
    """The stop's own exit (137) must not be taken for a crash by the Docker-events watcher."""
    from agent import launcher
    from agent import reconcile as node_reconcile

    settings.INSTANCE_STOP_GRACE_S = 1
    watcher_reconciled = threading.Event()
    reconcile_once, logs_tail = node_reconcile.agent_reconcile, launcher.container_logs_tail

    def watcher_reconcile(name):
        try:
            return reconcile_once(name)
        finally:
            watcher_reconciled.set()

    def slow_logs_tail(name):
        # The over-runtime path reads the log after its stop: let the watcher act on the exit first.
        if threading.current_thread() is threading.main_thread():
            watcher_reconciled.wait(10)
        return logs_tail(name)

    monkeypatch.setattr(node_reconcile, "agent_reconcile", watcher_reconcile)
    monkeypatch.setattr(launcher, "container_logs_tail", slow_logs_tail)
    with exit_watcher(node_worker):
        job = submit_job(api, catalog, command="sleep 600", max_runtime_s=60)
        wait_status(job.workload, "running")
        watcher_reconciled.clear()
        Workload.objects.filter(pk=job.workload.pk).update(max_runtime_s=1)
        wait_status(job.workload, "failed", poke=reconcile(node_worker))
    assert watcher_reconciled.is_set()
    assert "maximum runtime of 1 s" in job.workload.status_reason


def test_a_preempted_job_resumes_from_its_checkpoint_and_finishes(api, catalog, node_worker, settings, may_submit_high):
    settings.PREEMPTION_GRACE_S = 5
    long = submit_job(api, catalog, gpus="2", command=TRAINER)
    wait_status(long.workload, "running")
    # It has had a lot of service, so it sinks below new work and may be preempted.
    Workload.objects.filter(pk=long.workload.pk).update(attained_service=1e9)
    short = submit_job(api, catalog, command="sleep 1; echo short done", priority="high")

    wait_status(long.workload, "queued", timeout=40)
    assert long.workload.preemptions == 1
    assert long.workload.events.filter(to_status="queued", reason__contains="resume from its checkpoint").exists()
    step = int(read_volume(long.workload.volume_name, "step"))
    assert step > 0  # it got SIGTERM and checkpointed before stopping

    wait_status(short.workload, "succeeded", timeout=40, poke=reconcile(node_worker))
    wait_status(long.workload, "succeeded", timeout=60, poke=reconcile(node_worker))
    log = long.workload.log_tail
    assert f"start at {step}, resume 1, world 2" in log and "done at 25" in log


def test_a_spot_instance_is_preempted_by_on_demand_work_gets_sigterm_and_stops_metering(
    api, catalog, node_worker, settings
):
    settings.PREEMPTION_GRACE_S = 5
    settings.INSTANCE_IDLE_COMMAND = [
        "sh",
        "-c",
        "trap 'echo got-term > /root/autodl-tmp/term; exit 0' TERM; while :; do sleep 1; done",
    ]
    body = {
        "image": catalog["image"].pk,
        "gpu_type": catalog["rtx3090"].pk,
        "gpus": "2",
        "cpu_cores": 1,
        "memory_gb": 1,
        "disk_gb": 10,
    }
    spot = Instance.objects.get(
        pk=api.post("/api/v1/instances/", body | {"billing_mode": "spot"}, format="json").data["id"]
    )
    wait_status(spot.workload, "running")
    on_demand = Instance.objects.get(pk=api.post("/api/v1/instances/", body | {"gpus": "1"}, format="json").data["id"])

    wait_status(spot.workload, "stopped", timeout=40)
    assert "preempted" in spot.workload.status_reason and spot.workload.preemptions == 1
    assert read_volume(spot.workload.volume_name, "term") == "got-term"
    segment = MeterSegment.objects.get(workload=spot.workload)
    assert segment.ended_at is not None and "preempted" in segment.end_reason
    wait_status(on_demand.workload, "running", timeout=30)
    assert on_demand.workload.preemptions == 0


def test_jobs_of_others_are_invisible_and_untouchable(api, outsider_api, catalog, sim_node):
    job = submit_job(api, catalog)
    assert outsider_api.get("/api/v1/jobs/").data["results"] == []
    assert outsider_api.get(f"/api/v1/jobs/{job.pk}/").status_code == 404
    assert outsider_api.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 404


def test_a_job_without_a_command_is_refused_naming_the_field(api, catalog, sim_node):
    response = api.post(
        "/api/v1/jobs/",
        {"image": catalog["image"].pk, "gpu_type": catalog["rtx3090"].pk, "gpus": "1", "command": "  "},
        format="json",
    )
    assert response.status_code == 400 and "command" in response.data
    assert not Job.objects.exists()


def test_a_finished_job_is_noticed_at_once_through_docker_events(api, catalog, node_worker):
    with exit_watcher(node_worker):
        job = submit_job(api, catalog, command="sleep 1; echo finished")
        wait_status(job.workload, "succeeded", timeout=20)  # no reconcile poke: the die event does it
    assert "finished" in job.workload.log_tail


def test_a_succeeded_job_can_be_released_and_its_checkpoint_volume_goes(api, catalog, node_worker):
    job = submit_job(api, catalog, command="echo done > $GPUCLOUD_CHECKPOINT_DIR/out")
    wait_status(job.workload, "succeeded", poke=reconcile(node_worker))
    volume = job.workload.volume_name
    assert read_volume(volume, "out") == "done"

    response = api.post(f"/api/v1/jobs/{job.pk}/release/")
    assert response.status_code == 202, response.data
    wait_status(job.workload, "released")
    assert not docker_client().volumes.list(filters={"name": volume})
