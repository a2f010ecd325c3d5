"""Jobs with an environment of their own, and jobs on spot capacity: priced, evicted and resumed as spot."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import MeterSegment, Posting, RateCard
from billing.settlement import settle
from portal.models import Job
from scheduler.models import Workload
from tests.conftest import wait_status
from tests.portal.test_jobs_and_preemption import TRAINER, reconcile, submit_job

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_job_keeps_its_env_and_spot_and_shows_them(api, catalog, sim_node):
    job = submit_job(api, catalog, env={"LR": "3e-4", "EPOCHS": 10}, spot=True)
    data = api.get(f"/api/v1/jobs/{job.pk}/").data
    assert data["env"] == {"LR": "3e-4", "EPOCHS": "10"} and data["spot"] is True
    assert job.workload.spot and job.workload.preemptible
    plain = api.get(f"/api/v1/jobs/{submit_job(api, catalog).pk}/").data
    assert plain["env"] == {} and plain["spot"] is False


@pytest.mark.parametrize(
    "env",
    [{"1BAD": "x"}, {"A-B": "x"}, {f"V{i}": "x" for i in range(65)}, {"OK": "x" * 5000}],
    ids=["digit-first", "dash", "too-many", "too-long"],
)
def test_a_bad_environment_is_refused_naming_env(api, catalog, sim_node, env):
    response = api.post(
        "/api/v1/jobs/",
        {"image": catalog["image"].pk, "gpu_type": catalog["rtx3090"].pk, "gpus": "1", "command": "true", "env": env},
        format="json",
    )
    assert response.status_code == 400 and "env" in response.data, response.data
    assert not Job.objects.exists()


def test_the_console_form_takes_env_lines_and_spot(client, user, catalog, sim_node):
    client.force_login(user)
    form = {
        "name": "f",
        "gpu_type": catalog["rtx3090"].pk,
        "image": catalog["image"].pk,
        "gpus": "1",
        "cpu_cores": 1,
        "memory_gb": 1,
        "command": "true",
        "priority": 1,
        "env": "LR=1e-3\nNOTE=a=b\n",
        "spot": "on",
    }
    response = client.post("/jobs/new/", form)
    assert response.status_code == 302, response.content.decode()[-2000:]
    job = Job.objects.get()
    assert job.workload.env == {"LR": "1e-3", "NOTE": "a=b"} and job.workload.spot
    response = client.post("/jobs/new/", form | {"env": "no equals sign"})
    assert response.status_code == 200 and 'data-field="env"' in response.content.decode()


def test_a_jobs_env_reaches_its_container_beside_the_platforms(api, catalog, node_worker, settings):
    # The platform's names are refused at submission (tests/portal/test_env_reserved.py) and dropped from
    # work stored before that (tests/agent/test_gpu_request.py).
    job = submit_job(
        api, catalog, env={"GREETING": "hi there"}, command='echo "[$GREETING] [$GPUCLOUD_CHECKPOINT_DIR]"'
    )
    wait_status(job.workload, "succeeded", poke=reconcile(node_worker))
    assert f"[hi there] [{settings.JOB_CHECKPOINT_PATH}]" in job.workload.log_tail


def test_a_spot_job_is_evicted_by_on_demand_work_resumes_from_its_checkpoint_and_pays_spot(
    api, catalog, node_worker, settings
):
    settings.PREEMPTION_GRACE_S = 5
    spot = submit_job(api, catalog, gpus="2", command=TRAINER, spot=True)
    wait_status(spot.workload, "running")
    # An on-demand job in a queue no higher than the spot job's: only being spot makes it the victim.
    Workload.objects.filter(pk=spot.workload.pk).update(attained_service=0)
    on_demand = submit_job(api, catalog, command="sleep 1; echo on-demand done", priority="low")
    wait_status(on_demand.workload, "succeeded", timeout=40, poke=reconcile(node_worker))
    wait_status(spot.workload, "succeeded", timeout=60, poke=reconcile(node_worker))
    assert spot.workload.preemptions == 1 and spot.workload.spot
    assert spot.workload.events.filter(to_status="queued", reason__contains="resume from its checkpoint").exists()
    assert "resume 1" in spot.workload.log_tail and "done at 25" in spot.workload.log_tail
    segments = MeterSegment.objects.filter(workload=spot.workload)
    assert segments.count() == 2 and all(s.spot for s in segments)
    assert not MeterSegment.objects.get(workload=on_demand.workload).spot


def test_a_segment_run_on_spot_pays_spot_even_after_its_work_fell_back_to_on_demand(user, catalog):
    start = timezone.now() - timedelta(hours=3)
    RateCard.objects.create(gpu_model="", effective_from=start - timedelta(days=1), card_hour=Decimal(0))
    RateCard.objects.create(
        gpu_model="RTX3090",
        effective_from=start - timedelta(days=1),
        card_hour=Decimal("2.00"),
        spot_floor=Decimal("0.50"),
        spot_ceiling=Decimal("0.50"),
    )
    from tests.scheduler.factories import workload

    w = workload(user, kind="job", status="running", spot=False)  # fell back since
    MeterSegment.objects.create(workload=w, started_at=start, ended_at=start + timedelta(hours=1), spot=True)
    MeterSegment.objects.create(workload=w, started_at=start + timedelta(hours=2), ended_at=start + timedelta(hours=3))
    settle()
    amounts = sorted(Posting.objects.filter(segment__workload=w).values_list("amount", flat=True))
    assert sum(amounts) == Decimal("3.00")  # an hour at the spot price (1.00), an hour on-demand (2.00)
