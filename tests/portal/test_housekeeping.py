"""Idle instances are warned then stopped; long-stopped ones are released — on a real worker and Docker."""

from datetime import timedelta

import pytest
from django.utils import timezone

from agent.launcher import docker_client
from portal.models import Instance
from portal.services.housekeeping import housekeeping, idle_stop
from scheduler.models import Workload, WorkloadGpuMinute
from tests.conftest import wait_status
from tests.portal.test_instance_api import create
from tests.portal.test_jobs_and_preemption import read_volume, reconcile, submit_job

pytestmark = pytest.mark.django_db


def minutes_of(workload, peaks: list[float | None], now) -> None:
    """What the node agent's rollups write: one row per minute of the workload's card (None: no reading)."""
    gpu = workload.allocations.get().gpu
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=len(peaks))
    for i, peak in enumerate(peaks):
        WorkloadGpuMinute.objects.create(
            minute=start + timedelta(minutes=i),
            gpu=gpu,
            workload=workload,
            samples=60,
            util_avg=None if peak is None else peak / 2,
            util_max=peak,
        )


@pytest.fixture
def running(api, catalog, node_worker):
    assert create(api, catalog, idle_util_percent=10, idle_minutes=3).status_code == 201
    instance = Instance.objects.get()
    wait_status(instance.workload, "running", timeout=30)
    Workload.objects.filter(pk=instance.workload_id).update(started_at=timezone.now() - timedelta(minutes=10))
    instance.refresh_from_db()
    return instance


@pytest.mark.django_db(transaction=True)
def test_an_idle_instance_is_warned_in_the_console_then_stopped(running, api, client, user, settings):
    settings.IDLE_WARNING_S = 60
    now = timezone.now().replace(second=5)  # the checks below, up to 61 s later, span one minute boundary
    minutes_of(running.workload, [0.05, 0.02, 0.0], now)
    assert idle_stop(now) == [], "first the warning"
    client.force_login(user)
    assert "data-stop-warning" in client.get("/").content.decode()
    assert idle_stop(now + timedelta(seconds=30)) == [], "not before the warning's time is up"
    minutes_of(running.workload, [0.01], now + timedelta(minutes=1))  # the minute that ended meanwhile, idle too
    assert idle_stop(now + timedelta(seconds=61)) == [running.pk]
    wait_status(running.workload, "stopped", timeout=30)
    running.workload.refresh_from_db()
    assert "idle: GPU below 10% for 3 min" in running.workload.status_reason
    assert docker_client().containers.get(running.workload.container_name).status == "exited"


@pytest.mark.django_db(transaction=True)
def test_a_busy_minute_or_missing_samples_keep_it_running(running, settings):
    now = timezone.now()
    minutes_of(running.workload, [0.0, 0.5, 0.0], now)  # one busy minute
    assert idle_stop(now) == [] and Instance.objects.get().stop_warned_at is None
    WorkloadGpuMinute.objects.all().delete()
    minutes_of(running.workload, [0.0, 0.0], now)  # only two of the three minutes sampled
    assert idle_stop(now) == [] and Instance.objects.get().stop_warned_at is None


@pytest.mark.django_db(transaction=True)
def test_minutes_without_a_reading_never_stop_it(running, settings):
    # A fraction of a card under MPS: no per-tenant compute reading while its process runs, the rollup is NULL.
    now = timezone.now()
    minutes_of(running.workload, [None, None, None], now)
    assert idle_stop(now) == [] and Instance.objects.get().stop_warned_at is None
    WorkloadGpuMinute.objects.all().delete()
    minutes_of(running.workload, [0.0, None, 0.0, 0.0], now)  # read idle on either side of an unread minute
    assert idle_stop(now) == [] and Instance.objects.get().stop_warned_at is None


@pytest.mark.django_db(transaction=True)
def test_a_long_stopped_instance_is_announced_then_released(running, api, client, user, settings):
    settings.HOUSEKEEPING_DAYS = 15
    assert api.post(f"/api/v1/instances/{running.pk}/stop/").status_code == 202
    wait_status(running.workload, "stopped", timeout=30)
    Workload.objects.filter(pk=running.workload_id).update(status_changed_at=timezone.now() - timedelta(days=13))
    client.force_login(user)
    assert "data-release-warning" in client.get("/").content.decode()
    assert housekeeping() == []
    Workload.objects.filter(pk=running.workload_id).update(status_changed_at=timezone.now() - timedelta(days=16))
    assert housekeeping() == [running.workload_id]
    wait_status(running.workload, "released", timeout=30)


@pytest.mark.django_db(transaction=True)
def test_an_ended_job_says_how_long_its_checkpoints_are_kept_and_is_released_then(
    api, catalog, node_worker, client, user, settings
):
    settings.HOUSEKEEPING_DAYS = 15
    job = submit_job(api, catalog, command='echo done > "$AUTO_TMPDIR/out"')
    assert api.get(f"/api/v1/jobs/{job.pk}/").data["kept_until"] is None  # queued: nothing to count yet
    wait_status(job.workload, "succeeded", poke=reconcile(node_worker))
    body = api.get(f"/api/v1/jobs/{job.pk}/").data
    # No shared storage here (one host): its AUTO_TMPDIR is its own volume, kept on that host.
    assert body["auto_tmpdir"] == settings.JOB_CHECKPOINT_PATH == "/root/checkpoints"
    assert read_volume(job.workload.volume_name, "out") == "done"
    job.workload.refresh_from_db()
    kept_until = job.workload.status_changed_at + timedelta(days=15)
    assert body["kept_until"] == kept_until.isoformat().replace("+00:00", "Z")
    client.force_login(user)
    assert f"kept until {kept_until:%Y-%m-%d %H:%M} UTC" in client.get(f"/jobs/{job.pk}/").content.decode()

    Workload.objects.filter(pk=job.workload_id).update(status_changed_at=timezone.now() - timedelta(days=14))
    assert housekeeping() == []
    Workload.objects.filter(pk=job.workload_id).update(status_changed_at=timezone.now() - timedelta(days=16))
    assert housekeeping() == [job.workload_id]
    wait_status(job.workload, "released", timeout=30)
    assert not docker_client().volumes.list(filters={"name": job.workload.volume_name})
    assert api.get(f"/api/v1/jobs/{job.pk}/").data["kept_until"] is None
