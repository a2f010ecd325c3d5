"""The console's array page, the jobs list's array rows, and submitting an array from the job form."""

import pytest

from portal.models import ArrayStatus, Job, JobArray
from scheduler.models import Workload, WorkloadStatus
from tests.portal.test_arrays import create

pytestmark = pytest.mark.django_db(transaction=True)
S = WorkloadStatus


@pytest.fixture
def console(client, user):
    client.force_login(user)
    return client


def test_the_array_page_shows_progress_each_tasks_params_cost_and_its_job(api, console, catalog, sim_node):
    data = create(api, catalog, params={"lr": ["1e-3", "3e-4"]}, max_running=1)
    first, second = (Job.objects.get(pk=t["job"]) for t in data["tasks"])
    Workload.objects.filter(pk=first.workload_id).update(status=S.SUCCEEDED, exit_code=0)
    html = console.get(f"/arrays/{data['id']}/").content.decode()
    assert 'class="p-done" style="width:50.00%"' in html and 'class="p-queued" style="width:50.00%"' in html
    assert "<code>lr=1e-3</code>" in html and "<code>lr=3e-4</code>" in html
    assert f'href="/jobs/{second.pk}/"' in html and "at most 1 task running" in html
    assert "0.00 CNY" in html  # cost so far
    assert console.get(f"/arrays/{data['id']}/", headers={"HX-Request": "true"}).content.decode().count("<html") == 0


def test_cancel_and_retry_are_one_action_each_on_the_page(api, console, catalog, sim_node):
    data = create(api, catalog, array="0-2")
    response = console.post(f"/arrays/{data['id']}/cancel/", {"next": f"/arrays/{data['id']}/"})
    assert response.status_code == 302 and response["Location"] == f"/arrays/{data['id']}/"
    array = JobArray.objects.get()
    assert array.status == ArrayStatus.CANCELLED
    assert set(Workload.objects.filter(job__array=array).values_list("status", flat=True)) == {S.STOPPED}
    html = console.get(f"/arrays/{data['id']}/").content.decode()
    assert "Retry failed and cancelled tasks" in html and "Cancel the array" not in html
    console.post(f"/arrays/{data['id']}/retry/")
    array.refresh_from_db()
    assert array.status == ArrayStatus.RUNNING
    assert set(Workload.objects.filter(job__array=array).values_list("status", flat=True)) == {S.QUEUED}


def test_an_outsider_gets_404_for_the_page_and_its_actions(api, client, outsider, catalog, sim_node):
    data = create(api, catalog, array="0-1")
    client.force_login(outsider)
    assert client.get(f"/arrays/{data['id']}/").status_code == 404
    assert client.post(f"/arrays/{data['id']}/cancel/").status_code == 404
    assert JobArray.objects.get().status == ArrayStatus.RUNNING


def test_the_jobs_list_shows_an_array_as_one_row(api, console, catalog, sim_node):
    data = create(api, catalog, array="0-3%2")
    api.post(
        "/api/v1/jobs/",
        {"name": "solo", "image": catalog["image"].pk, "gpu_type": catalog["rtx3090"].pk, "gpus": "1", "command": "x"},
        format="json",
    )
    html = console.get("/jobs/").content.decode()
    assert html.count(f'data-array="{data["id"]}"') == 1 and "0 done, 0 running, 4 queued, 0 failed" in html
    assert ">solo</a>" in html and "sweep[0]" not in html


def test_the_job_form_submits_an_array_and_names_a_bad_one(console, catalog, sim_node):
    form = {
        "name": "grid",
        "gpu_type": catalog["rtx3090"].pk,
        "image": catalog["image"].pk,
        "gpus": "0.5",
        "cpu_cores": 1,
        "memory_gb": 1,
        "command": "python train.py --seed $SLURM_ARRAY_TASK_ID",
        "priority": 1,
        "spot": "on",
        "array": "0-3%2",
    }
    response = console.post("/jobs/new/", form)
    array = JobArray.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/arrays/{array.pk}/"
    assert array.total == 4 and array.max_running == 2 and array.spot
    response = console.post("/jobs/new/", form | {"array": "3-1"})
    assert response.status_code == 200 and 'data-field="array"' in response.content.decode()
    assert JobArray.objects.count() == 1
