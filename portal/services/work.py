"""Writes for the user's work, instances and batch jobs alike: create (validated, queued in one transaction),
the actions, and growing a disk."""

import logging
import re
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from billing.enforcement import may_start, member_may_start
from billing.ledger import payer_for
from billing.models import Membership
from core.clock import db_now
from core.errors import Conflict, InvalidInput
from core.messages import ToNode, ToScheduler, send_after_commit
from portal import limits
from portal.models import BillingMode, GpuType, Image, ImageStatus, Instance, Job
from portal.selectors import image_list, may_read_env
from portal.services import audit, images
from portal.services.requests import InstanceRequest, JobRequest, WorkRequest
from portal.services.slow import slow_operation_admit, slow_operations_lock
from scheduler import envnames
from scheduler.models import Priority, WorkloadKind, WorkloadStatus
from scheduler.policy import SHARE_FRACTIONS
from scheduler.policy.cluster import WHOLE_CARD
from scheduler.services import moves
from scheduler.services import workloads as scheduler
from scheduler.services.code import workload_code_attach
from scheduler.services.lifecycle import workload_note

log = logging.getLogger(__name__)
# The scheduler names resources its own way; users see these field names.
FIELD_NAMES = {
    "gpu_model": "gpu_type",
    "gpu_count": "gpus",
    "cpu_cores": "cpu_cores",
    "memory_mb": "memory_gb",
    "nodes": "nodes",
}


def offered_fractions() -> str:
    """The fractions of a card on offer, as a user reads them: "0.1, 0.2, 0.5"."""
    return ", ".join(str(f) for f in SHARE_FRACTIONS)


def check_gpus(gpus: Decimal, *, most: int = limits.MAX_CARDS, what: str = "instance") -> tuple[int, int]:
    """Whole cards (1..``most``) or one of the offered fractions of a card (``SHARE_FRACTIONS``: a card's
    MPS daemon serves one share size at a time, so the product offers a few) -> (cards, thousandths per card)."""
    if not gpus.is_finite() or gpus <= 0:
        raise InvalidInput(f"must be whole cards or a fraction of one card: {offered_fractions()}", field="gpus")
    if gpus < 1:
        if gpus not in SHARE_FRACTIONS:
            raise InvalidInput(
                f"{gpus.normalize()} of a card is not offered: a fraction of one card is one of {offered_fractions()} "
                "(a card serves one share size at a time); or ask for whole cards",
                field="gpus",
            )
        return 1, int(gpus * WHOLE_CARD)
    if gpus != gpus.to_integral_value():
        raise InvalidInput(
            f"{gpus.normalize()} is not possible: ask for whole cards, or a fraction of a card: {offered_fractions()}",
            field="gpus",
        )
    if gpus > most:
        raise InvalidInput(f"at most {most} cards per {what}", field="gpus")
    return int(gpus), WHOLE_CARD


def check_nodes(gpus: Decimal, nodes: int | None) -> int | None:
    """A job over ``nodes`` nodes (a gang): whole cards, the same number on each."""
    if nodes is None or nodes == 1:
        return nodes
    if not 1 <= nodes <= limits.MAX_NODES:
        raise InvalidInput(f"must be 1 .. {limits.MAX_NODES}", field="nodes")
    if gpus < 1 or gpus % nodes:
        raise InvalidInput(
            f"{gpus.normalize()} cards do not split evenly over {nodes} nodes: ask for whole cards, "
            "the same number on each node (gpus = nodes × cards per node)",
            field="nodes",
        )
    return nodes


def _catalog(*, owner, image_id: int, gpu_type_id: int):
    image = image_list(user=owner).filter(pk=image_id).first()
    if image is None:
        retired = Image.objects.filter(pk=image_id, visibility="official", status=ImageStatus.RETIRED).first()
        raise InvalidInput(f"{retired.status_reason} ({retired.name})" if retired else "unknown image", field="image")
    if image.status == ImageStatus.BUILDING:
        raise InvalidInput(f"{image.name} is still being built ({image.status_reason}): try again later", field="image")
    if image.status != ImageStatus.READY:
        raise InvalidInput(f"{image.name} is not available: {image.status_reason}", field="image")
    gpu_type = GpuType.objects.filter(pk=gpu_type_id, active=True).first()
    if gpu_type is None:
        raise InvalidInput("unknown GPU type", field="gpu_type")
    return image, gpu_type


def check_payable(workload_or_owner, team: str = "") -> None:
    """Refuse work on an account with no money left or its budget reached (402)."""
    owner_id = getattr(workload_or_owner, "owner_id", None) or workload_or_owner.pk
    team = getattr(workload_or_owner, "team", team)
    if team:
        member_may_start(owner_id, team)  # 402 past the member's monthly limit on the team
    may_start(payer_for(owner_id=owner_id, team_slug=team))


def _submit(**fields):
    """Queue the workload, naming refused fields the way users know them."""
    check_payable(fields["owner"], fields.get("team", ""))
    try:
        return scheduler.workload_submit(**fields)
    except InvalidInput as exc:
        raise InvalidInput(exc.message, field=FIELD_NAMES.get(exc.field, exc.field)) from exc


def _team(owner, team: str) -> str:
    """The team the work is charged to ("" for the owner's own wallet): the owner must be a member."""
    if not team:
        return ""
    if not Membership.objects.filter(user=owner, team__slug=team).exists():
        raise InvalidInput(f"you are not a member of team {team!r}", field="team")
    return team


def _work(request: WorkRequest, *, most: int = limits.MAX_CARDS):
    """(image, GPU type, the scheduler's view of the resources) of what a user asks for, checked."""
    owner = request.owner
    gpu_count, gpu_milli = check_gpus(request.gpus, most=most, what="instance" if most == limits.MAX_CARDS else "job")
    image, gpu_type = _catalog(owner=owner, image_id=request.image_id, gpu_type_id=request.gpu_type_id)
    work = dict(
        team=_team(owner, request.team),
        owner=owner,
        name=request.name,
        image_ref=image.docker_ref,
        gpu_model=gpu_type.name,
        gpu_count=gpu_count,
        gpu_milli=gpu_milli,
        cpu_cores=request.cpu_cores,
        memory_mb=request.memory_gb * 1024,
        # A saved image outside the registry exists only on the node it was committed on.
        pinned_node=image.node,
    )
    return image, gpu_type, work


def instance_create(request: InstanceRequest) -> Instance:
    image, gpu_type, work = _work(request)
    spot = request.billing_mode == BillingMode.SPOT
    with transaction.atomic():
        workload = _submit(**work, kind=WorkloadKind.INSTANCE, disk_gb=request.disk_gb, spot=spot)
        return Instance.objects.create(
            owner=request.owner,
            name=request.name,
            image=image,
            gpu_type=gpu_type,
            gpus=request.gpus,
            cpu_cores=request.cpu_cores,
            memory_gb=request.memory_gb,
            disk_gb=request.disk_gb,
            billing_mode=request.billing_mode,
            workload=workload,
            idle_util_percent=request.idle_util_percent,
            idle_minutes=request.idle_minutes or limits.DEFAULT_IDLE_MINUTES,
            stop_at=request.stop_at,
        )


def instance_clone(*, instance: Instance, owner) -> Instance:
    """A new instance with the same settings (image, GPUs, CPU, memory, disk size, billing, idle stop).

    The disk's contents are not copied: save the instance as an image for that.
    """
    return instance_create(
        InstanceRequest(
            owner=owner,
            name=f"{instance.name}-copy"[: limits.NAME_CHARS],
            image_id=instance.image_id,
            gpu_type_id=instance.gpu_type_id,
            gpus=instance.gpus,
            cpu_cores=instance.cpu_cores,
            memory_gb=instance.memory_gb,
            disk_gb=instance.disk_gb,
            billing_mode=instance.billing_mode,
            idle_util_percent=instance.idle_util_percent,
            idle_minutes=instance.idle_minutes,
            team=instance.workload.team,
        )
    )


ACTIONS = {
    "start": scheduler.workload_start,
    "start-no-gpu": scheduler.workload_start_no_gpu,
    "stop": scheduler.workload_stop,
    "restart": scheduler.workload_restart,
    "release": scheduler.workload_release,
    # A stopped instance's disks to another host with its GPU type (AutoDL's "migrate"): it starts there.
    "move": moves.workload_move,
}


def instance_act(*, instance: Instance, action: str, by=None) -> Instance:
    """Run one of ACTIONS on an instance ``by`` (None: the platform) has already been allowed to touch."""
    if action in ("start", "start-no-gpu", "release", "move") and images.image_busy(instance):
        raise Conflict(f"the instance is being saved as an image; {action} it when that is done")
    if action in ("start", "start-no-gpu"):
        check_payable(instance.workload)
    with transaction.atomic():
        if action in ("move", "restart"):
            slow_operation_admit(instance.owner)
        ACTIONS[action](instance.workload)
        audit.power_used(by=by, owner_id=instance.owner_id, action=action, target=f"instance {instance.pk}")
    return instance


ENV_NAME = re.compile(limits.ENV_NAME_PATTERN)


def check_env(env: dict | None) -> dict:
    """A job's environment: string -> string, shell variable names, at most ENV_ENTRIES of them, none of
    the names the platform or the NVIDIA Container Toolkit reads (``scheduler.envnames``)."""
    env = env or {}
    if not isinstance(env, dict):
        raise InvalidInput("must be an object of NAME: value strings", field="env")
    if len(env) > limits.ENV_ENTRIES:
        raise InvalidInput(f"at most {limits.ENV_ENTRIES} variables", field="env")
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            raise InvalidInput(f"{name!r} is not a variable name (letters, digits, _; not a digit first)", field="env")
        if why := envnames.why_reserved(name):
            raise InvalidInput(f"{name} may not be set: {why}", field="env")
        if not isinstance(value, str):
            raise InvalidInput(f"the value of {name} must be a string", field="env")
        if len(value) > limits.ENV_VALUE_CHARS:
            raise InvalidInput(f"the value of {name} is longer than {limits.ENV_VALUE_CHARS} characters", field="env")
    return dict(env)


@dataclass(frozen=True)
class PreparedJob:
    """A checked job request: the scheduler's fields and the catalog rows, ready to submit (maybe many times)."""

    work: dict
    image: object
    gpu_type: object
    gpus: Decimal
    command: str
    env: dict

    @property
    def team(self) -> str:
        return self.work["team"]


def job_create(request: JobRequest, *, code: bytes | None = None) -> Job:
    """Queue a batch job. Jobs are preemptible: they checkpoint to GPUCLOUD_CHECKPOINT_DIR and resume.

    ``spot``: it runs on spot capacity, at the spot price; any on-demand work may evict it (it
    resumes from its checkpoint), and it never evicts on-demand work. ``code`` (a .tar.gz) is stored
    with it; its node's agent extracts it into the job's data disk and runs the command there
    (``scheduler.services.code``). A job may ask for more cards than one node has: it runs as a gang,
    one container per node (``nodes`` of them with gpus / nodes cards each, or as few as it takes);
    ``cpu_cores`` and ``memory_gb`` are per node. ``elastic_min``..``elastic_max``: an elastic job, which the
    scheduler may run on any size in that range around ``gpus`` (``scheduler.services.elastic``).
    """
    job = job_prepare(request)
    if request.elastic_min is not None or request.elastic_max is not None:
        job.work.update(elastic_min=request.elastic_min, elastic_max=request.elastic_max)
    check_priority(request.owner, request.priority)
    check_payable(request.owner, job.team)
    with transaction.atomic():
        created = job_submit(
            job,
            priority=request.priority,
            max_runtime_s=request.max_runtime_s,
            checkpoint_gb=request.checkpoint_gb,
            spot=request.spot,
        )
        if code is not None:
            workload_code_attach(workload=created.workload, archive=code)
        return created


HIGH_PRIORITY_PERMISSION = "scheduler.submit_high_priority"


def check_priority(owner, priority: int) -> None:
    """High priority jumps the queue: only for those an administrator allows (superusers, or a user or group
    holding ``scheduler.submit_high_priority``); normal and low are everyone's."""
    if priority == Priority.HIGH and not owner.has_perm(HIGH_PRIORITY_PERMISSION):
        raise InvalidInput(
            "high priority is for users an administrator allows (permission submit_high_priority); "
            "use normal or low, or ask an administrator",
            field="priority",
        )


def job_prepare(request: JobRequest) -> PreparedJob:
    """Check what a user asks a job (or each task of an array) to be; nothing is written."""
    check_gpus(request.gpus, most=limits.MAX_JOB_CARDS, what="job")
    nodes = check_nodes(request.gpus, request.nodes)
    if not request.command.strip():
        raise InvalidInput("a job needs a command", field="command")
    env = check_env(request.env)
    image, gpu_type, work = _work(request, most=limits.MAX_JOB_CARDS)
    if nodes:
        work["nodes"] = nodes
    return PreparedJob(work=work, image=image, gpu_type=gpu_type, gpus=request.gpus, command=request.command, env=env)


def job_submit(
    job: PreparedJob,
    *,
    priority: int = 1,
    max_runtime_s: int | None = None,
    checkpoint_gb: int = 50,
    spot: bool = False,
    name: str | None = None,
    env: dict | None = None,
    group=None,
    **job_fields,
) -> Job:
    """Queue one prepared job (call inside a transaction; payability already checked).

    ``env`` is added to the job's own; ``job_fields`` go on the Job row (array, array_index, params).
    """
    work = dict(job.work, name=name or job.work["name"])
    try:
        workload = scheduler.workload_submit(
            **work,
            kind=WorkloadKind.JOB,
            disk_gb=checkpoint_gb,
            preemptible=True,
            spot=spot,
            priority=priority,
            max_runtime_s=max_runtime_s,
            command=["sh", "-c", job.command],
            env={**job.env, **(env or {})},
            group=group,
        )
    except InvalidInput as exc:
        raise InvalidInput(exc.message, field=FIELD_NAMES.get(exc.field, exc.field)) from exc
    return Job.objects.create(
        owner=work["owner"],
        name=work["name"],
        image=job.image,
        gpu_type=job.gpu_type,
        gpus=job.gpus,
        command=job.command,
        cpu_cores=work["cpu_cores"],
        memory_gb=work["memory_mb"] // 1024,
        workload=workload,
        **job_fields,
    )


JOB_ACTIONS = {"cancel": scheduler.workload_stop, "release": scheduler.workload_release}


def job_env_read(job: Job, *, by) -> bool:
    """Whether ``by`` is shown ``job``'s environment on its page: its owner, or a holder of core.powers.READ_WORK_ENV —
    whose read is audited."""
    if not may_read_env(user=by, workload=job.workload):
        return False
    audit.power_used(by=by, owner_id=job.owner_id, action="read-env", target=f"job {job.pk}")
    return True


def job_act(*, job: Job, action: str, by=None) -> Job:
    with transaction.atomic():
        JOB_ACTIONS[action](job.workload)
        audit.power_used(by=by, owner_id=job.owner_id, action=action, target=f"job {job.pk}")
    return job


def instance_grow_disk(*, instance: Instance, disk_gb: int, by=None) -> Instance:
    """Grow the data disk (never shrink): recorded at once if it has no disk yet, else when its node has grown it.

    The node grows the filesystem online, so a running instance keeps running.
    """
    with transaction.atomic():
        slow_operations_lock(instance.owner)
        instance = Instance.objects.select_for_update().select_related("workload").get(pk=instance.pk)
        workload = instance.workload
        if workload.status in (WorkloadStatus.RELEASING, WorkloadStatus.RELEASED):
            raise Conflict(f"the instance is {workload.status}")
        if instance.disk_growing_to is not None:
            raise Conflict(f"the disk is already growing to {instance.disk_growing_to} GB; wait until it is done")
        if disk_gb <= instance.disk_gb:
            raise InvalidInput(f"a disk only grows: give more than {instance.disk_gb} GB", field="disk_gb")
        if disk_gb > limits.DISK_GB.max:
            raise InvalidInput(f"at most {limits.DISK_GB.max} GB", field="disk_gb")
        audit.power_used(by=by, owner_id=instance.owner_id, action="grow-disk", target=f"instance {instance.pk}")
        node = workload.disk_node
        if node is None:  # never ran: its disk is made at the new size when it starts
            _disk_recorded(instance, disk_gb)
            return instance
        growing = Instance.objects.filter(disk_growing_to__isnull=False).filter(
            Q(workload__node=node) | Q(workload__node__isnull=True, workload__pinned_node=node)
        )
        pending = sum(to - now for to, now in growing.values_list("disk_growing_to", "disk_gb"))
        scheduler.disk_growth_check(node, more_gb=disk_gb - instance.disk_gb, growing_gb=pending)
        slow_operation_admit(instance.owner)
        instance.disk_growing_to, instance.disk_growing_since = disk_gb, Now()
        instance.save(update_fields=["disk_growing_to", "disk_growing_since"])
        send_after_commit(ToNode.DISK_GROW, workload.pk, disk_gb, ToScheduler.DISK_GROWN, instance.pk, node=node.name)
    return instance


def _disk_recorded(instance: Instance, disk_gb: int) -> None:
    Instance.objects.filter(pk=instance.pk).update(disk_gb=disk_gb, disk_growing_to=None, disk_growing_since=None)
    scheduler.workload_disk_set(instance.workload_id, disk_gb)
    instance.refresh_from_db()


def disk_grown(instance_id: int, disk_gb: int, error: str, *, host: str | None = None) -> None:
    """The node's reply: the new size is recorded (storage is charged on it from now), or why not. ``host``: the
    host that signed it (None: the control plane); taken only from the host holding the instance's disk."""
    with transaction.atomic():
        instance = Instance.objects.select_for_update().filter(pk=instance_id, disk_growing_to=disk_gb).first()
        if instance is None:
            return
        workload = instance.workload
        home = workload.disk_node
        if host is not None and (home is None or home.name != host):
            log.warning("refused host %s's reply about instance %s's disk: its disk is not there", host, instance_id)
            return
        if error:
            Instance.objects.filter(pk=instance_id).update(disk_growing_to=None, disk_growing_since=None)
            reason = f"growing the data disk to {disk_gb} GB failed: {error}"
        else:
            _disk_recorded(instance, disk_gb)
            reason = f"data disk grown to {disk_gb} GB"
        workload_note(instance.workload_id, reason)


def disks_overdue() -> list[int]:
    """Disk growths with no answer by DISK_GROW_DEADLINE_S have failed, saying so (the size stays as
    it was); returns the instances. The node's task may not run longer than that deadline."""
    deadline = settings.DISK_GROW_DEADLINE_S
    cutoff = db_now() - timedelta(seconds=deadline)
    overdue = Instance.objects.filter(disk_growing_to__isnull=False, disk_growing_since__lt=cutoff)
    changed = []
    for instance_id, disk_gb in overdue.values_list("pk", "disk_growing_to"):
        disk_grown(instance_id, disk_gb, f"its node did not answer within {deadline} s")
        changed.append(instance_id)
    return changed
