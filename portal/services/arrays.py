"""Job arrays (sweeps): submit many tasks as one, cancel and retry them together, keep them in budget.

Each task is an ordinary ``Job``; the array's ``WorkloadGroup`` is what the scheduler sees
(at most ``max_running`` tasks run at once, spot members fall back to on-demand where the
array allows it). What the scheduler does not know — money — is watched here:
``array_supervise`` runs after every change of one of its tasks (portal.receivers) and every
``ARRAY_SUPERVISE_S`` for every running array, and stops the array before its spend can
pass its budget.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone

from billing.prices import estimate, rate_card_now
from billing.statements import cost_so_far
from core.errors import Conflict, InvalidInput, TooMany
from portal.models import ArrayStatus, Fallback, Job, JobArray
from portal.services import audit, work
from portal.services.array_spec import task_env, tasks_of
from portal.services.requests import ArrayRequest
from scheduler.models import Workload, WorkloadStatus
from scheduler.services import workloads as scheduler
from scheduler.services.code import array_code_attach

log = logging.getLogger(__name__)
S = WorkloadStatus
ZERO = Decimal("0.00")
ACTIVE = [S.QUEUED, S.STARTING, S.RUNNING, S.STOPPING]
HOLDING = [S.STARTING, S.RUNNING, S.STOPPING]
# A task's state as the array shows it (the keys of ``counts``).
TASK_STATE = {
    S.QUEUED: "queued",
    S.STARTING: "running",
    S.RUNNING: "running",
    S.STOPPING: "running",
    S.SUCCEEDED: "done",
    S.FAILED: "failed",
    S.STOPPED: "cancelled",
}
STATES = ["done", "running", "queued", "failed", "cancelled"]


def task_state(job: Job) -> str:
    w = job.workload
    if w.status in TASK_STATE:
        return TASK_STATE[w.status]
    # Released (or being released) by its owner: what it had come to.
    return "cancelled" if w.exit_code is None else ("done" if w.exit_code == 0 else "failed")


def array_create(request: ArrayRequest, *, code: bytes | None = None) -> JobArray:
    """Queue every task of an array in one transaction (all or none), each with its index and parameters.

    ``code`` (a .tar.gz, as a job's) is stored once for the whole array; every task runs in it."""
    r, owner, name = request, request.owner, request.name
    tasks, limit = tasks_of(array=r.array, params=r.params)
    if limit is not None and r.max_running is not None and limit != r.max_running:
        raise InvalidInput(f"the array says %{limit}: leave max_running out or make it {limit}", field="max_running")
    if r.fallback not in Fallback.values:
        raise InvalidInput(f"one of {', '.join(Fallback.values)}", field="fallback")
    if r.budget is not None and r.budget <= 0:
        raise InvalidInput("a budget must be more than 0", field="budget")
    if r.nodes is not None and r.nodes > 1:
        raise InvalidInput("the tasks of an array run on one node each", field="nodes")
    if r.elastic_min is not None or r.elastic_max is not None:
        raise InvalidInput("the tasks of an array have one size each: leave elastic out", field="elastic_min")
    work.check_priority(owner, r.priority)
    job = work.job_prepare(r)
    work.check_payable(owner, job.team)
    waiting = Workload.objects.filter(owner=owner, status=S.QUEUED).count()
    if waiting + len(tasks) > settings.MAX_QUEUED_PER_USER:
        # Each task waits in the queue as a job of its own (the scheduler re-checks under its lock).
        raise TooMany(
            f"the array has {len(tasks)} tasks and {waiting} of your instances and jobs are waiting already: at "
            f"most {settings.MAX_QUEUED_PER_USER} may wait at once; submit fewer tasks, or wait for some to start"
        )
    card = rate_card_now(job.gpu_type.name)
    falls_back = r.fallback == Fallback.ON_DEMAND
    with transaction.atomic():
        group = scheduler.group_create(
            name=name,
            max_running=limit or r.max_running,
            fallback_after=r.max_preemptions if falls_back else None,
            fallback_at=r.deadline if falls_back else None,
        )
        created = JobArray.objects.create(
            owner=owner,
            name=name,
            spec=r.array or "",
            grid=r.params or {},
            total=len(tasks),
            max_running=limit or r.max_running,
            spot=r.spot,
            fallback=r.fallback,
            max_preemptions=r.max_preemptions,
            deadline=r.deadline,
            budget=r.budget,
            currency=card.currency if card else job.gpu_type.currency,
            group=group,
        )
        scheduler.group_rename(group, f"array {created.pk}: {name}")
        submitted = []
        for task in tasks:
            suffix = f"[{task.index}]"
            submitted.append(
                work.job_submit(
                    job,
                    priority=r.priority,
                    max_runtime_s=r.max_runtime_s,
                    checkpoint_gb=r.checkpoint_gb,
                    spot=r.spot,
                    name=name[: 64 - len(suffix)] + suffix,
                    env=task_env(task, array_id=created.pk, tasks=tasks),
                    group=group,
                    array=created,
                    array_index=task.index,
                    params=task.params,
                )
            )
        if code is not None:
            array_code_attach(workloads=[task.workload for task in submitted], archive=code)
    return created


def _tasks(array: JobArray) -> list[Job]:
    return list(array.tasks.select_related("workload").order_by("array_index"))


def _end(array: JobArray, *, status: str, reason: str) -> bool:
    """Mark a running array ended (compare-and-swap) and stop every task still queued or running."""
    with transaction.atomic():
        ended = JobArray.objects.filter(pk=array.pk, status=ArrayStatus.RUNNING).update(
            status=status, status_reason=reason[:255], finished_at=Now()
        )
        if not ended:
            return False
        _stop_tasks(array, reason)
    array.refresh_from_db()
    return True


def _stop_tasks(array: JobArray, reason: str) -> int:
    """Queued tasks leave the queue, running ones stop (SIGTERM first). Tasks being stopped are left
    to finish stopping: a preempted one that comes back to the queue is stopped at the next look."""
    stopped = 0
    for job in array.tasks.select_related("workload__node").filter(workload__status__in=[S.QUEUED, *HOLDING]):
        try:
            scheduler.workload_stop(job.workload, reason=f"stopped: {reason}")
            stopped += 1
        except Conflict:
            pass  # already stopping (or done meanwhile)
    return stopped


def array_cancel(*, array: JobArray, by=None) -> JobArray:
    mine = by is None or by.pk == array.owner_id
    if not _end(array, status=ArrayStatus.CANCELLED, reason="cancelled by its owner" if mine else "cancelled by staff"):
        raise Conflict(f"the array is {array.status} already")
    audit.power_used(by=by, owner_id=array.owner_id, action="cancel", target=f"array {array.pk}")
    return array


def array_retry(*, array: JobArray, by=None) -> JobArray:
    """Queue its failed and cancelled tasks again (each resumes from its checkpoint, on its node)."""
    again = [job for job in _tasks(array) if job.workload.status in (S.FAILED, S.STOPPED)]
    if not again:
        raise Conflict("no failed or cancelled task to retry")
    if array.budget is not None:
        spent = array_cost(_tasks(array))
        if spent >= array.budget:
            raise Conflict(f"its budget of {array.budget} {array.currency} is spent ({spent}): nothing to retry with")
    work.check_payable(array.owner, again[0].workload.team)
    with transaction.atomic():
        JobArray.objects.filter(pk=array.pk).update(status=ArrayStatus.RUNNING, status_reason="", finished_at=None)
        for job in again:
            scheduler.workload_start(job.workload)
        audit.power_used(by=by, owner_id=array.owner_id, action="retry", target=f"array {array.pk}")
    array.refresh_from_db()
    return array


def array_cost(tasks: list[Job]) -> Decimal:
    costs = cost_so_far([job.workload_id for job in tasks])
    return sum(costs.values(), ZERO)


@dataclass(frozen=True)
class Progress:
    counts: dict[str, int]
    cost: Decimal
    task_costs: dict[int, Decimal]  # by workload id


def array_counts(tasks: list[Job]) -> dict[str, int]:
    counts = dict.fromkeys(STATES, 0)
    for job in tasks:
        counts[task_state(job)] += 1
    return counts


def array_progress(array: JobArray, tasks: list[Job] | None = None) -> Progress:
    tasks = _tasks(array) if tasks is None else tasks
    costs = cost_so_far([job.workload_id for job in tasks])
    return Progress(array_counts(tasks), sum(costs.values(), ZERO), costs)


def _hourly(tasks: list[Job]) -> dict[bool, Decimal]:
    """What one task costs per hour now, on spot (True) and on-demand (False): the tasks share one shape."""
    w = tasks[0].workload
    price = estimate(
        gpu_model=w.gpu_model, cards=w.gpu_count, milli=w.gpu_milli, cpu_cores=w.cpu_cores, memory_mb=w.memory_mb
    )
    if price is None:
        return {True: ZERO, False: ZERO}
    return {True: Decimal(price["spot_per_hour"]), False: Decimal(price["on_demand_per_hour"])}


def budget_headroom(array: JobArray, tasks: list[Job]) -> Decimal:
    """What the array may spend before it can next be stopped: each running task until a stop takes
    effect (the next look plus the stop's grace), and each queued task that may start meanwhile
    (at least a minute each: every run pays one)."""
    window = settings.ARRAY_SUPERVISE_S + settings.INSTANCE_STOP_GRACE_S
    running = [job for job in tasks if job.workload.status in HOLDING]
    queued = [job for job in tasks if job.workload.status == S.QUEUED]
    room = len(queued) if array.max_running is None else max(array.max_running - len(running), 0)
    starting = queued[: min(room, len(queued))]
    if not running and not starting:
        return ZERO
    hourly = _hourly(tasks)
    seconds = Decimal(window) / 3600
    first = Decimal(max(window, 60)) / 3600
    return sum((hourly[job.workload.spot] * seconds for job in running), ZERO) + sum(
        (hourly[job.workload.spot] * first for job in starting), ZERO
    )


def array_supervise(array: JobArray) -> str:
    """One look at an array: stop it at its budget, stop tasks an ended array still has, record its end.

    Returns its status. Safe to run any number of times, concurrently too (every write is a
    compare-and-swap or a stop that refuses a second time).
    """
    tasks = _tasks(array)
    if array.status in (ArrayStatus.CANCELLED, ArrayStatus.STOPPED):
        _stop_tasks(array, array.status_reason)
        return array.status
    if array.status != ArrayStatus.RUNNING:
        return array.status
    if array.budget is not None:
        spent = array_cost(tasks)
        if spent + budget_headroom(array, tasks) >= array.budget:
            reason = (
                f"budget of {array.budget} {array.currency} reached: {spent} spent, and what runs would pass it "
                "before it could be stopped"
                if spent < array.budget
                else f"budget of {array.budget} {array.currency} reached: {spent} spent"
            )
            if _end(array, status=ArrayStatus.STOPPED, reason=reason):
                log.info("array %s stopped: %s", array.pk, reason)
            return array.status
    counts = array_counts(tasks)
    if counts["queued"] or counts["running"]:
        return array.status
    if counts["done"] == len(tasks):
        status, reason = ArrayStatus.DONE, f"all {len(tasks)} tasks succeeded"
    else:
        status = ArrayStatus.FAILED
        reason = f"{counts['failed']} failed, {counts['cancelled']} cancelled, {counts['done']} succeeded"
    JobArray.objects.filter(pk=array.pk, status=ArrayStatus.RUNNING).update(
        status=status, status_reason=reason, finished_at=timezone.now()
    )
    array.refresh_from_db()
    return array.status


def array_supervise_group(group_id: int) -> None:
    """After a task of the array that owns this group changed."""
    array = JobArray.objects.filter(group_id=group_id).first()
    if array is not None:
        array_supervise(array)


def arrays_supervise() -> int:
    """Every array that is not over (or has tasks to stop): the periodic look. Returns how many."""
    arrays = JobArray.objects.filter(status=ArrayStatus.RUNNING) | JobArray.objects.filter(
        status__in=[ArrayStatus.CANCELLED, ArrayStatus.STOPPED], tasks__workload__status__in=ACTIVE
    )
    looked = 0
    for array in arrays.distinct():
        array_supervise(array)
        looked += 1
    return looked
