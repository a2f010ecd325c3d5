"""What a node agent does for its host: register, launch, stop, restart, release (reconcile.py converges).

Each function takes ids, reloads, returns early when the work is already done
(so a redelivered task is harmless), talks to Docker outside any transaction,
then records the outcome with a compare-and-swap transition.
"""

import logging
import os
import socket
import threading

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db.models import Count
from django.db.models.functions import Now

from agent import collector, disks, gangs, hostservices, launcher, mps, network, toolkit, worklogs
from agent.gpus import discover
from agent.iptables import IptablesError
from agent.sharedfs import checkpoint_dir_ensure, checkpoint_dir_remove, mount_ensure, user_dir_ready
from core.errors import ServiceError
from core.messages import ToNode, ToScheduler, send
from portal.models import Image, ImageStatus
from scheduler import sharedfs
from scheduler.models import (
    Allocation,
    MemberStatus,
    Node,
    NodeStatus,
    Workload,
    WorkloadKind,
    WorkloadMember,
    WorkloadStatus,
)
from scheduler.registry import RegistryError, image_name
from scheduler.services import gangs as gang_service
from scheduler.services.code import workload_code_archive
from scheduler.services.lifecycle import workload_transition
from scheduler.services.nodes import node_register
from scheduler.services.runs import run_number_take

log = logging.getLogger(__name__)
S = WorkloadStatus


def _shares(workload: Workload, *, node_id: int | None = None) -> list[launcher.CardShare]:
    """Its shares (on ``node_id`` only: a gang's member there)."""
    allocations = Allocation.objects.filter(workload=workload).select_related("gpu").order_by("gpu__index")
    if node_id is not None:
        allocations = allocations.filter(gpu__node_id=node_id)
    return [launcher.CardShare(a.gpu.uuid, a.milli, a.memory_mb, a.gpu.memory_mb) for a in allocations]


_launching: set[int] = set()
_launching_lock = threading.Lock()


def agent_launch(workload_id: int, node_name: str | None = None) -> None:
    """Launch the work's container once, however often the launch is sent (the control plane sends it
    again when it stays starting: its first message may have been lost). ``node_name``: this agent's node,
    where a gang's member is launched."""
    with _launching_lock:
        if workload_id in _launching:
            return  # this agent is launching it right now
        _launching.add(workload_id)
    try:
        _launch(workload_id, node_name or settings.NODE_NAME)
    finally:
        with _launching_lock:
            _launching.discard(workload_id)


def _launch(workload_id: int, node_name: str) -> None:
    workload = Workload.objects.select_related("node").filter(pk=workload_id).first()
    if not _launchable(workload):
        return
    if workload.is_gang:
        members = gang_service.gang_members(workload)
        member = next((m for m in members if m.node_name == node_name), None)
        if member is not None and member.status == MemberStatus.STARTING:
            _launch_member(workload, members, member)
        return
    run = None
    try:
        if launcher.image_missing(workload):
            # A pull can take many minutes: it goes to the slow queue, which sends the launch back here.
            send(ToNode.IMAGE_PULL, workload.pk, node=workload.node.name)
            return
        if settings.INSTANCE_NETWORK_MODE == "fenced":
            network.fence_check()
        if sharedfs.enabled():
            user_dir_ready(workload.owner_id)  # the owner's files, under its quota on this host too
            if workload.kind == WorkloadKind.JOB:
                checkpoint_dir_ensure(workload.owner_id, workload.uid)  # its AUTO_TMPDIR, on every host
        code = workload_code_archive(workload.pk) if workload.kind == WorkloadKind.JOB else None
        shares = _shares(workload)
        spec = launcher.container_spec(workload, node=workload.node, shares=shares, with_code=code is not None)
        mps.cards_prepare(workload.node, shares, engine=launcher.engine_info, host=hostservices.mps_host())
        collector.settle(workload.container_name)  # the last run's output is stored before this run begins
        run = _run_begin(workload)
        files = {launcher.HOSTFILE: launcher.hostfile(workload, launcher.Rendezvous())}
        container_id = launcher.container_launch(workload, spec, code=code, files=files)
        ports = launcher.container_ports(workload.container_name) if "ports" in spec else {}
    except Exception as exc:  # Docker, HTTP timeouts, a refused spec: the work fails, never hangs in starting
        log.warning("launch of workload %s failed: %s", workload_id, exc)
        reason = _launch_failed(workload, exc)
        if run is not None:
            worklogs.run_close(workload.pk, run, f"… {reason}")
        return
    if not workload_transition(
        workload,
        to=S.RUNNING,
        allowed_from=[S.STARTING],
        reason="container running",
        container_id=container_id,
        ports=ports,
        started_at=Now(),
    ):
        # Stopped, released or lost while it launched: do not leave its container running.
        log.info("workload %s left starting while it launched; stopping its container", workload_id)
        launcher.container_stop(workload.container_name, grace_s=settings.INSTANCE_STOP_GRACE_S)


def _launchable(workload: Workload | None) -> bool:
    """Whether a launch (or its image's pull) may go on: the work is starting, or it is a gang that runs while
    a member joins it (an elastic gang: ``services.elastic``)."""
    return workload is not None and (
        workload.status == S.STARTING or (workload.status == S.RUNNING and workload.is_gang)
    )


def _launch_member(workload: Workload, members: list[WorkloadMember], member: WorkloadMember) -> None:
    """Start a gang's member on this node: its cards here, its rank, rank 0's address and port.

    On the fenced network rank 0 starts first: each member's fixed address is chosen and recorded, and
    this host's fence lets it through to its fellows, before its container starts; the others wait for
    rank 0's address (``MASTER_ADDR``), and the control plane sends their launch again once it is there.
    Every member opens a run of the job's log here (its rank's piece, collected before its container goes).
    A member that cannot start is reported as exited: the control plane stops the gang as one.
    """
    member.workload = workload
    name = member.container_name
    run = None
    try:
        if launcher.image_missing(workload):
            # As for single-node work: the slow queue pulls it, then sends this member's launch back here.
            send(ToNode.IMAGE_PULL, workload.pk, member.node_name, node=member.node_name)
            return
        fenced = settings.INSTANCE_NETWORK_MODE == "fenced"
        address = member.address
        if fenced:
            network.fence_check()
            if member.rank == 0 and not address:  # first thing: the others wait for it
                address = gangs.member_address_pick(member)
                if not address:
                    return  # it left starting meanwhile
        if sharedfs.enabled():  # (may wait for the owner's quota: the others get ready meanwhile)
            user_dir_ready(workload.owner_id)
            checkpoint_dir_ensure(workload.owner_id, workload.uid)
        if fenced and member.rank:
            if not members[0].address:
                log.info("rank %s of gang %s waits for rank 0's address", member.rank, workload.pk)
                return
            address = address or gangs.member_address_pick(member)
            if not address:
                return
        code = workload_code_archive(workload.pk) if workload.kind == WorkloadKind.JOB else None
        cards = dict(
            Allocation.objects.filter(workload=workload)
            .values_list("gpu__node_id")
            .annotate(n=Count("id"))
            .values_list("gpu__node_id", "n")
        )
        if fenced:
            gangs.gang_rules_sync(member.node_name)  # its way to its fellows, before its first packet
        master = address if member.rank == 0 else members[0].address
        rendezvous = launcher.Rendezvous(
            rank=member.rank,
            hosts=tuple(
                (m.node.address if m.node else m.node_name, cards.get(m.node_id, 0))
                for m in members
                if m.status in MemberStatus.live()
            ),
            master_addr=(master if fenced else "") or (members[0].node.address if members[0].node else ""),
            master_port=workload.master_port or settings.GANG_PORT_MIN,
            address=address,
            host_address=member.node.address if member.node else "",
        )
        shares = _shares(workload, node_id=member.node_id)
        spec = launcher.container_spec(
            workload, node=member.node, shares=shares, with_code=code is not None, rendezvous=rendezvous, name=name
        )
        # Whole cards: no MPS daemon left holding them from a fraction.
        mps.cards_prepare(member.node, shares, engine=launcher.engine_info, host=hostservices.mps_host())
        gangs.old_members_remove(workload, keep=name)
        collector.settle(name)
        run = _run_begin(workload, node=member.node, rank=member.rank, container=name)
        files = {launcher.HOSTFILE: launcher.hostfile(workload, rendezvous)}
        container_id = launcher.container_launch(workload, spec, code=code, files=files)
        address = address or launcher.container_address(name)
    except Exception as exc:  # Docker, a refused spec, an image: the gang stops as one, never hangs
        log.warning("launch of rank %s of gang %s failed: %s", member.rank, workload.pk, exc)
        reason = _launch_reason(exc)
        if run is not None:
            worklogs.run_close(workload.pk, run, f"… {reason}")
        gang_service.member_exited(member, exit_code=None, reason=reason)
        return
    if not gang_service.member_running(member, container_id=container_id, address=address):
        log.info("rank %s of gang %s was stopped while it launched; stopping its container", member.rank, workload.pk)
        launcher.container_stop(name, grace_s=settings.INSTANCE_STOP_GRACE_S)
        return
    if settings.INSTANCE_NETWORK_MODE == "fenced":
        try:
            gangs.gang_rules_sync(member.node_name)
        except IptablesError as exc:  # it could never reach its fellows: the gang stops (and starts again)
            member.refresh_from_db()
            reason = f"cannot reach its fellow members through the fence: {exc}"
            gang_service.member_exited(member, exit_code=None, reason=reason)


def _launch_reason(exc: Exception) -> str:
    """Why a launch failed, as its work's status reason."""
    # An image this host cannot pull says so itself ("cannot pull image X from the registry Y: why").
    return exc.message[:255] if isinstance(exc, RegistryError) else f"failed to start: {_short(exc)}"


def _launch_failed(workload: Workload, exc: Exception) -> str:
    """Fail a launch, saying why; returns the reason."""
    reason = _launch_reason(exc)
    workload_transition(workload, to=S.FAILED, allowed_from=[S.STARTING], reason=reason, finished_at=Now())
    return reason


def agent_image_pull(workload_id: int, node_name: str | None = None) -> None:
    """Pull a starting work's image into this host's engine (slow queue), then send its launch back to
    the node's queue; a pull that fails fails the launch, saying why. ``node_name``: this host, where a
    gang's member is launched (its failure is the member's: the gang stops as one)."""
    workload = Workload.objects.select_related("node").filter(pk=workload_id).first()
    if not _launchable(workload):
        return
    member = None
    if workload.is_gang:
        member = gang_service.gang_member_on(workload, node_name or settings.NODE_NAME)
        if member is None or member.status != MemberStatus.STARTING:
            return
    try:
        launcher.image_pull(workload.image_ref)
    except Exception as exc:  # the registry refused or is unreachable; out of time (soft limit)
        log.warning("pulling %s for workload %s failed: %s", workload.image_ref, workload_id, exc)
        if member is None:
            _launch_failed(workload, exc)
        else:
            gang_service.member_exited(member, exit_code=None, reason=_launch_reason(exc))
        return
    if member is None:
        send(ToNode.LAUNCH, workload.pk, node=workload.node.name)
    else:
        send(ToNode.LAUNCH, workload.pk, member.node_name, node=member.node_name)


def _run_begin(workload: Workload, *, node=None, rank: int = 0, container: str = "") -> int:
    """Number this start of the work's container (a gang's member's: on ``node``, with its ``rank``), where
    this piece of its log lives, and open its log here."""
    run = run_number_take(workload, node or workload.node, rank=rank)
    worklogs.run_begin(
        workload_id=workload.pk,
        uid=workload.uid,
        owner_id=workload.owner_id,
        run=run,
        container=container or workload.container_name,
        rank=rank,
    )
    return run


def agent_stop(workload_id: int, node_name: str | None = None) -> None:
    """Stop the container (SIGTERM, then SIGKILL after the grace period) and record why (a gang's: its member
    on this node, ``node_name``)."""
    workload = Workload.objects.filter(pk=workload_id).first()
    if workload is None or workload.status not in (S.STOPPING, S.RUNNING):
        return
    if workload.is_gang:  # stopping as one, or running on while this member leaves (services.elastic)
        member = gang_service.gang_member_on(workload, node_name or settings.NODE_NAME)
        if member is not None and (workload.status == S.STOPPING or member.status == MemberStatus.LEAVING):
            _stop_member(workload, member)
        return
    if workload.status != S.STOPPING:
        return
    preempted = workload.preempt_requested
    grace = settings.PREEMPTION_GRACE_S if preempted else settings.INSTANCE_STOP_GRACE_S
    try:
        exit_code = launcher.container_stop(workload.container_name, grace_s=grace)
    except Exception as exc:  # Docker or HTTP errors: the work ends failed rather than stuck in stopping
        workload_transition(
            workload, to=S.FAILED, allowed_from=[S.STOPPING], reason=f"failed to stop: {_short(exc)}", finished_at=Now()
        )
        return
    now = Now()
    common = dict(exit_code=exit_code, preempt_requested=False, preemptions=workload.preemptions + int(preempted))
    if preempted and workload.kind == WorkloadKind.JOB:
        # Back to the queue, on this node: its checkpoint volume lives here — unless its checkpoints are on
        # the shared storage, or the node takes no new work (drained): then anywhere, resuming from a
        # checkpoint its command can reach.
        stay = not sharedfs.enabled() and Node.objects.filter(pk=workload.node_id, status=NodeStatus.ACTIVE).exists()
        workload_transition(
            workload,
            to=S.QUEUED,
            allowed_from=[S.STOPPING],
            reason="preempted; queued to resume from its checkpoint",
            queued_at=now,
            pinned_node=workload.node if stay else None,
            **common,
        )
    elif preempted:
        workload_transition(
            workload,
            to=S.STOPPED,
            allowed_from=[S.STOPPING],
            finished_at=now,
            reason="preempted: spot capacity was needed by on-demand work; start it again later",
            **common,
        )
    else:
        if workload.kind == WorkloadKind.JOB:
            common["log_tail"] = launcher.container_logs_tail(workload.container_name)
        # A stop the platform asked for says why ("stopped: balance exhausted ..."); a user's is plain.
        reason = workload.status_reason if workload.status_reason.startswith("stopped: ") else "stopped"
        workload_transition(workload, to=S.STOPPED, allowed_from=[S.STOPPING], reason=reason, finished_at=now, **common)


def _stop_member(workload: Workload, member: WorkloadMember) -> None:
    """Stop a gang's member here: the grace period to checkpoint when the gang is requeued or the member leaves
    an elastic gang that runs on, then report it."""
    if member.status not in MemberStatus.live():
        return
    member.workload = workload
    leaving = member.status == MemberStatus.LEAVING
    grace = settings.PREEMPTION_GRACE_S if workload.preempt_requested or leaving else settings.INSTANCE_STOP_GRACE_S
    stopped = True
    try:
        exit_code = launcher.container_stop(member.container_name, grace_s=grace)
    except Exception as exc:  # Docker: reported stopped all the same (the reconcile fence stops it later)
        log.warning("stopping rank %s of gang %s failed: %s", member.rank, workload.pk, exc)
        exit_code, stopped = None, False
    gang_service.member_stopped(
        member, exit_code=exit_code, reason=member.reason if leaving else workload.status_reason
    )
    if stopped:  # its output is in the log and its checkpoints on the shared storage: a new start is a new container
        launcher.container_delete(member.container_name)
    if settings.INSTANCE_NETWORK_MODE == "fenced":
        gangs.gang_rules_sync_logged(member.node_name)


def agent_restart(workload_id: int) -> None:
    """Restart the container of work its restart claimed (``workload_restart``), then end the claim.

    The claim keeps the exit watcher from taking the restart's stop for the work's end. If the
    claim was lost meanwhile (the work was stopped, released, or its claim expired and the work
    was settled as ended), the container this restart started again is stopped: it may not run
    on cards the work no longer holds.
    """
    workload = Workload.objects.filter(pk=workload_id).first()
    if workload is None or workload.status != S.RUNNING or not workload.restarting:
        return
    reason = "container restarted"
    try:
        if not launcher.container_restart(workload.container_name, grace_s=settings.INSTANCE_STOP_GRACE_S):
            reason = "restart failed: its container is gone"
    except Exception as exc:  # Docker or HTTP errors: the claim ends; reconciliation reads what runs
        log.warning("restart of workload %s failed: %s", workload_id, exc)
        reason = f"restart failed: {_short(exc)}"
    ended = workload_transition(
        workload,
        to=S.RUNNING,
        allowed_from=[S.RUNNING],
        where={"restarting": True, "restarts": workload.restarts},
        reason=reason,
        restarting=False,
    )
    if not ended:
        workload.refresh_from_db(fields=["status"])
        if workload.status != S.RUNNING:
            log.info("workload %s left running while it restarted; stopping its container", workload_id)
            launcher.container_stop(workload.container_name, grace_s=settings.INSTANCE_STOP_GRACE_S)


def agent_release(workload_id: int) -> None:
    workload = Workload.objects.filter(pk=workload_id).first()
    if workload is None or workload.status != S.RELEASING:
        return
    launcher.container_remove(workload)
    if sharedfs.enabled() and workload.kind == WorkloadKind.JOB:
        checkpoint_dir_remove(workload.owner_id, workload.uid)  # its checkpoints on the shared storage go with it
    workload_transition(workload, to=S.RELEASED, allowed_from=[S.RELEASING], reason="released", finished_at=Now())


def agent_checkpoints_remove(owner_id: int, uid: str) -> None:
    """Delete a released job's checkpoint folder for the control plane: the job's own host is lost (every host
    mounts the same shared storage). Only a released job's: the message's word is not enough (any host can
    sign one), and a queued job resumes from that folder."""
    job = Workload.objects.filter(owner_id=owner_id, uid=uid, kind=WorkloadKind.JOB).first()
    if job is None or job.status != S.RELEASED:
        log.warning("checkpoints of %s (user %s) kept: the job is %s", uid, owner_id, job and job.status)
        return
    if sharedfs.enabled():
        mount_ensure()
        checkpoint_dir_remove(owner_id, uid)


def agent_image_commit(workload_id: int, ref: str, reply_to: str, reply_id: int) -> None:
    """Commit the stopped work's container as image ``ref``, push it if ``ref`` names a registry, and
    tell the control plane (task ``reply_to``).

    The reply carries (reply_id, size in bytes, error text): the agent writes no catalog row.
    """
    workload = Workload.objects.filter(pk=workload_id).first()
    size, error = 0, ""
    try:
        if workload is None or workload.status != S.STOPPED:
            raise ServiceError("the instance must be stopped while it is saved")
        size = launcher.container_commit(workload, ref)
        if image_name(ref).registry:
            launcher.image_push(ref)
    except Exception as exc:  # Docker or a state change: the image is marked failed, with why
        log.warning("saving workload %s as %s failed: %s", workload_id, ref, exc)
        error = _short(exc)
    _reply(reply_to, reply_id, size, error)


def agent_image_remove(ref: str, reply_to: str, reply_id: int) -> None:
    """Remove image ``ref`` from this host's engine; reply to ``reply_to`` unless it is "" (best effort).

    Only a saved image that is being deleted (image ``reply_id``), or was (every host's cached copy): the
    message's word is not enough (any host can sign one), and a host may hold the only copy of an image."""
    deleted = Image.objects.filter(docker_ref=ref, status__in=[ImageStatus.DELETING, ImageStatus.DELETED])
    if not deleted.filter(**({"pk": reply_id} if reply_to else {})).exists():
        log.warning("image %s kept: no image of it is being deleted", ref)
        return
    error = ""
    try:
        launcher.image_remove(ref)
    except Exception as exc:  # e.g. still used by a container (Docker 409)
        error = _short(exc)
    if reply_to:
        _reply(reply_to, reply_id, 0, error)


def agent_disk_grow(workload_id: int, size_gb: int, reply_to: str, reply_id: int) -> None:
    """Grow the work's data disk to ``size_gb`` (online if it runs); the reply says (reply_id, size, error)."""
    error = ""
    try:
        workload = Workload.objects.get(pk=workload_id)
        if settings.INSTANCE_DISK_QUOTA:
            disks.disk_grow(workload.volume_name, size_gb)
    except Exception as exc:  # a missing tool, a full host disk: the size stays as it was, with why
        log.warning("growing the disk of workload %s failed: %s", workload_id, exc)
        error = _short(exc)
    _reply(reply_to, reply_id, size_gb, error)


def _reply(task: str, *args) -> None:
    send(ToScheduler(task), *args)


def _short(exc: Exception) -> str:
    if isinstance(exc, SoftTimeLimitExceeded):
        return "it did not finish within its time limit"
    text = exc.message if isinstance(exc, ServiceError) else str(exc)
    return (text.splitlines() or [type(exc).__name__])[0][:200]


def agent_register(node_name: str, *, relay_url: str = "", relay_tls_sha256: str = "") -> Node:
    """Register this host and its cards (NVML, or the simulated spec), and where its relay listens (with the
    SHA-256 of the certificate it serves there over TLS).

    Real cards need an NVIDIA Container Toolkit of at least ``toolkit.MINIMUM``: ToolkitError, and the node
    does not register (agent/toolkit.py says why)."""
    gpus, simulated = discover(settings.GPU_BACKEND, node_name=node_name, sim_default=settings.SIM_GPU_DEFAULT)
    if not simulated:
        log.info("NVIDIA Container Toolkit %s (at least %s)", toolkit.toolkit_require(), toolkit.MINIMUM)
    info = launcher.docker_client().info()
    host_cpus = os.cpu_count() or 1
    host_memory_mb = info.get("MemTotal", 0) // (1024 * 1024)
    overcommit = simulated and settings.NODE_OVERCOMMIT_SIMULATED
    # A demo host (simulated cards, overcommit on) offers what such cards come with, however small the machine.
    simulated_cpus = max(host_cpus, settings.SIM_CPUS_PER_CARD * len(gpus)) if overcommit else 0
    return node_register(
        name=node_name,
        hostname=socket.gethostname(),
        address=settings.NODE_ADDRESS,
        relay_url=relay_url,
        relay_tls_sha256=relay_tls_sha256,
        # NODE_CPUS / NODE_MEMORY_MB may hold some back for the host, never promise more than it has
        # (but simulated hosts sharing one development machine may, when told so).
        cpu_cores=_at_most(settings.NODE_CPUS or simulated_cpus, host_cpus, "NODE_CPUS", may_exceed=overcommit),
        memory_mb=_at_most(settings.NODE_MEMORY_MB, host_memory_mb, "NODE_MEMORY_MB", may_exceed=overcommit),
        disk_gb=_disk_offered(len(gpus), overcommit=overcommit),
        gpus=gpus,
        simulated=simulated,
        nvidia_runtime="nvidia" in (info.get("Runtimes") or {}),
        docker_version=info.get("ServerVersion", ""),
    )


def _disk_offered(cards: int, *, overcommit: bool) -> int | None:
    """GB this host offers its tenants' disks (NODE_DISK_GB, never more than its data root holds less
    NODE_DISK_MIN_FREE_GB; a demo host: SIM_DISK_GB_PER_CARD a card); None when the data root cannot be read."""
    if overcommit:
        return settings.NODE_DISK_GB or settings.SIM_DISK_GB_PER_CARD * max(cards, 1)
    measured = disks.host_disk_gb(launcher.docker_root)
    if measured is None:
        log.warning("the engine's data root cannot be read: this host's disk is not counted at placement")
        return None
    usable = max(measured[0] - settings.NODE_DISK_MIN_FREE_GB, 0)
    return _at_most(settings.NODE_DISK_GB, usable, "NODE_DISK_GB")


def _at_most(configured: int, host: int, name: str, *, may_exceed: bool = False) -> int:
    if configured and may_exceed:
        return configured
    if configured > host:
        log.warning("%s=%s is more than this host has (%s): advertising %s", name, configured, host, host)
    return min(configured, host) if configured else host
