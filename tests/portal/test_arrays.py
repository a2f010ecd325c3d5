"""Job arrays through the API: syntax, grids, each task's environment, cancel, retry, budget, the bill."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from billing.ledger import user_account
from billing.models import MeterSegment, RateCard
from billing.settlement import settle
from billing.statements import statement, statement_groups
from portal.models import ArrayStatus, Job, JobArray
from portal.services import arrays
from scheduler import tick
from scheduler.models import Workload, WorkloadStatus
from tests.conftest import wait_for
from tests.portal.test_jobs_and_preemption import TRAINER, reconcile

pytestmark = pytest.mark.django_db(transaction=True)
S = WorkloadStatus


def body(catalog, **overrides):
    return {
        "name": "sweep",
        "image": catalog["image"].pk,
        "gpu_type": catalog["rtx3090"].pk,
        "gpus": "1",
        "command": "python train.py",
        "cpu_cores": 1,
        "memory_gb": 1,
    } | overrides


def create(api, catalog, **overrides):
    response = api.post("/api/v1/arrays/", body(catalog, **overrides), format="json")
    assert response.status_code == 201, response.data
    return response.data


@pytest.mark.parametrize(
    "spec", ["", "0-", "5-2", "a-b", "0-31%0", "0-31%x", "1,,3", "0-5:0", "0-100000", "0-3;rm -rf"]
)
def test_bad_array_syntax_is_refused_naming_the_array_field(api, catalog, sim_node, spec):
    response = api.post("/api/v1/arrays/", body(catalog, array=spec), format="json")
    assert response.status_code == 400 and "array" in response.data, response.data
    assert not JobArray.objects.exists() and not Job.objects.exists()


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"params": {"lr": []}}, "params"),
        ({"params": {"1lr": ["1"]}}, "params"),
        ({"params": {"a": [str(i) for i in range(40)], "b": [str(i) for i in range(40)]}}, "params"),
        ({"array": "0-3", "params": {"lr": ["1"]}}, "array"),
        ({"array": "0-3%2", "max_running": 3}, "max_running"),
        ({"array": "0-3", "fallback": "sometimes"}, "fallback"),
        ({"array": "0-3", "budget": "0"}, "budget"),
    ],
)
def test_other_mistakes_name_their_field(api, catalog, sim_node, extra, field):
    response = api.post("/api/v1/arrays/", body(catalog, **extra), format="json")
    assert response.status_code == 400 and field in response.data, response.data
    assert not JobArray.objects.exists()


def test_slurm_indices_make_one_task_each_capped_on_spot_with_their_environment(api, catalog, sim_node):
    data = create(api, catalog, array="1,3,5-9:2%2", env={"EPOCHS": "3"})
    assert data["total"] == 5 and data["max_running"] == 2 and data["spot"] is True
    assert [t["index"] for t in data["tasks"]] == [1, 3, 5, 7, 9]
    assert data["counts"] == {"done": 0, "running": 0, "queued": 5, "failed": 0, "cancelled": 0}
    assert data["status"] == "running" and data["currency"] == "CNY" and data["fallback"] == "none"
    job = Job.objects.get(pk=data["tasks"][1]["job"])
    env = job.workload.env
    assert env["EPOCHS"] == "3"
    assert (env["GPUCLOUD_ARRAY_INDEX"], env["SLURM_ARRAY_TASK_ID"], env["GPUCLOUD_ARRAY_COUNT"]) == ("3", "3", "5")
    assert env["SLURM_ARRAY_JOB_ID"] == str(data["id"]) and env["SLURM_ARRAY_TASK_MAX"] == "9"
    assert job.workload.spot and job.workload.group.max_running == 2 and job.name == "sweep[3]"
    shown = api.get(f"/api/v1/jobs/{job.pk}/").data
    assert (shown["array"], shown["array_index"], shown["spot"]) == (data["id"], 3, True)


def test_a_parameter_grid_is_the_cartesian_product_passed_as_environment(api, catalog, sim_node):
    data = create(api, catalog, params={"lr": ["1e-3", "3e-4"], "bs": [32, 64]}, max_running=3, spot=False)
    assert data["total"] == 4 and data["max_running"] == 3 and data["spot"] is False
    assert [t["params"] for t in data["tasks"]] == [
        {"lr": "1e-3", "bs": "32"},
        {"lr": "1e-3", "bs": "64"},
        {"lr": "3e-4", "bs": "32"},
        {"lr": "3e-4", "bs": "64"},
    ]
    env = Job.objects.get(pk=data["tasks"][2]["job"]).workload.env
    assert (env["lr"], env["GPUCLOUD_PARAM_LR"], env["bs"], env["GPUCLOUD_PARAM_BS"]) == ("3e-4", "3e-4", "32", "32")
    assert env["GPUCLOUD_ARRAY_INDEX"] == "2"


def test_the_live_tick_runs_no_more_tasks_than_the_cap(api, catalog, sim_node):
    data = create(api, catalog, array="0-5%2")  # three free RTX 3090 cards... of which the cap allows two
    tick.schedule_tick()
    statuses = [Job.objects.get(pk=t["job"]).workload.status for t in data["tasks"]]
    assert statuses.count(S.STARTING) == 2 and statuses.count(S.QUEUED) == 4
    waiting = Job.objects.get(pk=data["tasks"][5]["job"]).workload
    assert "at most 2 of its array run at once" in waiting.status_reason


def test_arrays_of_others_are_invisible_and_untouchable(api, outsider_api, catalog, sim_node):
    data = create(api, catalog, array="0-1")
    assert outsider_api.get("/api/v1/arrays/").data["results"] == []
    for request in (
        lambda: outsider_api.get(f"/api/v1/arrays/{data['id']}/"),
        lambda: outsider_api.post(f"/api/v1/arrays/{data['id']}/cancel/"),
        lambda: outsider_api.post(f"/api/v1/arrays/{data['id']}/retry/"),
    ):
        assert request().status_code == 404
    assert JobArray.objects.get().status == ArrayStatus.RUNNING


def test_cancel_stops_every_task_and_retry_queues_the_cancelled_and_failed_ones_again(api, catalog, sim_node):
    data = create(api, catalog, array="0-3")
    first = Job.objects.get(pk=data["tasks"][0]["job"]).workload
    Workload.objects.filter(pk=first.pk).update(status=S.SUCCEEDED, exit_code=0)
    response = api.post(f"/api/v1/arrays/{data['id']}/cancel/")
    assert response.status_code == 202
    assert response.data["status"] == "cancelled" and response.data["status_reason"] == "cancelled by its owner"
    assert response.data["counts"] == {"done": 1, "running": 0, "queued": 0, "failed": 0, "cancelled": 3}
    assert api.post(f"/api/v1/arrays/{data['id']}/cancel/").status_code == 409

    failed = Job.objects.get(pk=data["tasks"][1]["job"]).workload
    Workload.objects.filter(pk=failed.pk).update(status=S.FAILED, exit_code=1)
    response = api.post(f"/api/v1/arrays/{data['id']}/retry/")
    assert response.status_code == 202, response.data
    assert response.data["status"] == "running"
    assert response.data["counts"] == {"done": 1, "running": 0, "queued": 3, "failed": 0, "cancelled": 0}
    assert api.get("/api/v1/arrays/").data["results"][0]["id"] == data["id"]
    assert api.post(f"/api/v1/arrays/{data['id']}/retry/").status_code == 409  # nothing left to retry


def test_an_array_whose_tasks_all_succeeded_is_done(api, catalog, sim_node):
    data = create(api, catalog, array="0-1")
    array = JobArray.objects.get()
    Workload.objects.filter(job__array=array).update(status=S.SUCCEEDED, exit_code=0)
    assert arrays.array_supervise(array) == ArrayStatus.DONE
    assert api.get(f"/api/v1/arrays/{data['id']}/").data["status"] == "done"


@pytest.fixture(autouse=True)
def rates_in_force_for_days(catalog):
    """The catalog's rate cards start when it is loaded: make them older than the runs the tests record."""
    RateCard.objects.update(effective_from=timezone.now() - timedelta(days=2))


def _spent(array: JobArray, hours: float) -> None:
    """One task of the array ran ``hours`` (a closed meter segment)."""
    job = array.tasks.order_by("array_index").first()
    end = timezone.now() - timedelta(minutes=1)
    MeterSegment.objects.create(
        workload=job.workload, started_at=end - timedelta(hours=hours), ended_at=end, spot=job.workload.spot
    )


def test_the_budget_stops_the_array_with_a_reason_and_stops_its_tasks(api, catalog, sim_node):
    data = create(api, catalog, array="0-3", budget="1.00", spot=False)  # RTX 3090 on-demand: 1.58 / h
    array = JobArray.objects.get()
    assert arrays.array_supervise(array) == ArrayStatus.RUNNING  # nothing spent, nothing running
    _spent(array, hours=1)
    assert arrays.array_supervise(array) == ArrayStatus.STOPPED
    array.refresh_from_db()
    assert "budget of 1.00 CNY reached" in array.status_reason
    statuses = set(Workload.objects.filter(job__array=array).values_list("status", flat=True))
    assert statuses == {S.STOPPED}
    shown = api.get(f"/api/v1/arrays/{data['id']}/").data
    assert shown["status"] == "stopped" and Decimal(shown["cost"]) >= Decimal("1.00")
    assert api.post(f"/api/v1/arrays/{data['id']}/retry/").status_code == 409  # the budget is spent


def test_the_budget_stops_the_array_before_what_runs_can_pass_it(api, catalog, sim_node, settings):
    settings.ARRAY_SUPERVISE_S = 600  # a look every ten minutes
    create(api, catalog, array="0-1%1", budget="1.50", spot=False)
    array = JobArray.objects.get()
    _spent(array, hours=0.5)  # 0.79 spent
    assert len(tick.schedule_tick().placed) == 1  # one task runs (its cap), the other waits
    # 0.79 + 1.58 / h x (600 + 10) s = 1.06: still under 1.50, it goes on
    assert arrays.array_supervise(array) == ArrayStatus.RUNNING
    settings.ARRAY_SUPERVISE_S = 1800  # 0.79 + 1.58 / h x 1810 s = 1.58: it would pass 1.50 before the next look
    assert arrays.array_supervise(array) == ArrayStatus.STOPPED
    array.refresh_from_db()
    assert "what runs would pass it" in array.status_reason


def test_a_task_preempted_more_than_allowed_falls_back_to_on_demand_and_keeps_its_checkpoint_node(
    api, catalog, sim_node
):
    data = create(api, catalog, array="0-1", fallback="on-demand", max_preemptions=1)
    tired, fresh = (Job.objects.get(pk=t["job"]).workload for t in data["tasks"])
    Workload.objects.filter(pk=tired.pk).update(preemptions=2, pinned_node=sim_node)
    Workload.objects.filter(pk=fresh.pk).update(preemptions=1)
    tick.schedule_tick()
    tired.refresh_from_db(), fresh.refresh_from_db()
    assert not tired.spot and fresh.spot
    assert tired.status == S.STARTING and tired.node_id == sim_node.pk
    shown = api.get(f"/api/v1/arrays/{data['id']}/").data["tasks"]
    assert [(t["spot"], t["preemptions"]) for t in shown] == [(False, 2), (True, 1)]


def test_without_a_fallback_a_task_stays_on_spot_however_often_it_is_preempted(api, catalog, sim_node):
    data = create(api, catalog, array="0", max_preemptions=1)
    task = Job.objects.get(pk=data["tasks"][0]["job"]).workload
    Workload.objects.filter(pk=task.pk).update(preemptions=9)
    tick.schedule_tick()
    task.refresh_from_db()
    assert task.spot


def test_the_bill_shows_an_array_as_a_group_with_its_total(api, user, catalog, sim_node):
    create(api, catalog, array="0-2", spot=False)
    array = JobArray.objects.get()
    alone = api.post("/api/v1/jobs/", body(catalog), format="json").data
    end = timezone.now() - timedelta(minutes=5)
    for hours, job in zip([1, 2, 0.5], array.tasks.order_by("array_index"), strict=True):
        MeterSegment.objects.create(workload=job.workload, started_at=end - timedelta(hours=hours), ended_at=end)
    solo = Job.objects.get(pk=alone["id"]).workload
    MeterSegment.objects.create(workload=solo, started_at=end - timedelta(hours=1), ended_at=end)
    settle()
    groups = statement_groups(statement(user_account(user), timezone.now().strftime("%Y-%m")))
    [group] = [g for g in groups if g.name]
    assert group.name == f"array {array.pk}: sweep" and len(group.lines) == 3
    assert group.total == sum(line.amount for line in group.lines) and group.total >= Decimal("5.52")
    assert [g.lines[0].workload_id for g in groups if not g.name] == [solo.pk]

    page = api.get("/api/v1/billing/statement/").data
    assert sum(1 for line in page if line["group"] == group.name) == 3
    client = Client()
    client.force_login(user)
    html = client.get("/billing/").content.decode()
    assert group.name in html and f"<th data-group-total>{group.total}</th>" in html


def test_a_task_that_finished_marks_its_array_done_through_the_scheduler_queue(api, catalog, node_worker):
    """The receiver's message reaches the worker, which records the array's end (no test-made transitions)."""
    data = create(api, catalog, array="0-1", command="echo task $GPUCLOUD_ARRAY_INDEX of $GPUCLOUD_ARRAY_COUNT")
    array = JobArray.objects.get()
    poke = reconcile(node_worker)
    wait_for(lambda: (array.refresh_from_db(), array.status)[1] == ArrayStatus.DONE, timeout=60, poke=poke)
    logs = [Job.objects.get(pk=t["job"]).workload.log_tail for t in data["tasks"]]
    assert "task 0 of 2" in logs[0] and "task 1 of 2" in logs[1]


def test_a_task_that_comes_back_to_the_queue_after_its_array_ended_is_stopped_at_the_next_look(api, catalog, sim_node):
    data = create(api, catalog, array="0-1")
    assert api.post(f"/api/v1/arrays/{data['id']}/cancel/").status_code == 202
    # A task that was being preempted when the array was cancelled comes back queued, as preempted jobs do.
    straggler = Job.objects.get(pk=data["tasks"][1]["job"]).workload
    Workload.objects.filter(pk=straggler.pk).update(status=S.QUEUED)
    assert arrays.arrays_supervise() == 1
    straggler.refresh_from_db()
    assert straggler.status == S.STOPPED and "cancelled by its owner" in straggler.status_reason
    assert arrays.arrays_supervise() == 0  # nothing left to look at


def test_a_spot_task_evicted_more_than_allowed_resumes_on_demand_from_its_checkpoint(
    api, catalog, node_worker, settings
):
    """Real containers: the task is evicted once (more than max_preemptions=0), comes back on-demand, resumes
    from its checkpoint and finishes; its first run is metered on spot, its second on-demand."""
    settings.PREEMPTION_GRACE_S = 5
    data = create(api, catalog, array="0", gpus="2", command=TRAINER, fallback="on-demand", max_preemptions=0)
    task = Job.objects.get(pk=data["tasks"][0]["job"]).workload
    wait_for(lambda: (task.refresh_from_db(), task.status)[1] == S.RUNNING, timeout=30, what="the task running")
    on_demand = api.post("/api/v1/jobs/", body(catalog, command="sleep 1", priority="low"), format="json").data
    poke = reconcile(node_worker)
    wait_for(lambda: (task.refresh_from_db(), task.status)[1] == S.SUCCEEDED, timeout=90, poke=poke, what="done")
    assert task.preemptions == 1 and not task.spot
    assert task.events.filter(reason__contains="preempted more often than its array allows (1 > 0)").exists()
    assert "resume 1" in task.log_tail and "done at 25" in task.log_tail
    assert [s.spot for s in MeterSegment.objects.filter(workload=task).order_by("started_at")] == [True, False]
    other = Job.objects.get(pk=on_demand["id"]).workload
    assert other.preemptions == 0
    array = JobArray.objects.get()
    wait_for(lambda: (array.refresh_from_db(), array.status)[1] == ArrayStatus.DONE, timeout=30, what="array done")
    # The other job done too: no launch of it still under way when the test's database is flushed (one in
    # flight then held a lock the flush deadlocked on).
    wait_for(lambda: (other.refresh_from_db(), other.status)[1] == S.SUCCEEDED, timeout=60, poke=poke, what="other")


def test_an_array_larger_than_the_queue_allows_is_refused_whole_saying_why(api, catalog, sim_node, settings):
    settings.MAX_QUEUED_PER_USER = 10
    api.post("/api/v1/jobs/", body(catalog), format="json")
    response = api.post("/api/v1/arrays/", body(catalog, array="0-9"), format="json")
    assert response.status_code == 429 and "the array has 10 tasks and 1 of your" in str(response.data)
    assert not JobArray.objects.exists() and Job.objects.count() == 1
    assert api.post("/api/v1/arrays/", body(catalog, array="0-8"), format="json").status_code == 201
