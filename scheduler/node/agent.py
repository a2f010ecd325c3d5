"""What a node agent does for its host: launch, stop, restart, release, reconcile, heartbeat.

Each function takes ids, reloads, returns early when the work is already done
(so a redelivered task is harmless), talks to Docker outside any transaction,
then records the outcome with a compare-and-swap transition.
"""

import logging
import os
import socket
import threading

import docker
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from scheduler.errors import ServiceError
from scheduler.models import Allocation, Gpu, Node, Workload, WorkloadKind, WorkloadStatus
from scheduler.node import launcher
from scheduler.node.gpus import discover
from scheduler.node.telemetry import nvml_samples, utilization_record
from scheduler.services.lifecycle import workload_transition
from scheduler.services.nodes import node_heartbeat, node_register

log = logging.getLogger(__name__)
S = WorkloadStatus


def _shares(workload: Workload) -> list[launcher.CardShare]:
    allocations = Allocation.objects.filter(workload=workload).select_related("gpu").order_by("gpu__index")
    return [launcher.CardShare(a.gpu.uuid, a.milli, a.memory_mb) for a in allocations]


def agent_launch(workload_id: int) -> None:
    workload = Workload.objects.select_related("node").filter(pk=workload_id).first()
    if workload is None or workload.status != S.STARTING:
        return
    try:
        spec = launcher.container_spec(workload, node=workload.node, shares=_shares(workload))
        container_id = launcher.container_launch(workload, spec)
    except Exception as exc:  # Docker, HTTP timeouts, a refused spec: the work fails, never hangs in starting
        log.warning("launch of workload %s failed: %s", workload_id, exc)
        workload_transition(
            workload,
            to=S.FAILED,
            allowed_from=[S.STARTING],
            reason=f"failed to start: {_short(exc)}",
            finished_at=timezone.now(),
        )
        return
    if not workload_transition(
        workload,
        to=S.RUNNING,
        allowed_from=[S.STARTING],
        reason="container running",
        container_id=container_id,
        started_at=timezone.now(),
    ):
        # Stopped, released or lost while it launched: do not leave its container running.
        log.info("workload %s left starting while it launched; stopping its container", workload_id)
        launcher.container_stop(workload.container_name, grace_s=settings.INSTANCE_STOP_GRACE_S)


def agent_stop(workload_id: int) -> None:
    """Stop the container (SIGTERM, then SIGKILL after the grace period) and record why."""
    workload = Workload.objects.filter(pk=workload_id).first()
    if workload is None or workload.status != S.STOPPING:
        return
    preempted = workload.preempt_requested
    grace = settings.PREEMPTION_GRACE_S if preempted else settings.INSTANCE_STOP_GRACE_S
    try:
        exit_code = launcher.container_stop(workload.container_name, grace_s=grace)
    except docker.errors.DockerException as exc:
        workload_transition(
            workload,
            to=S.FAILED,
            allowed_from=[S.STOPPING],
            reason=f"failed to stop: {_short(exc)}",
            finished_at=timezone.now(),
        )
        return
    now = timezone.now()
    common = dict(exit_code=exit_code, preempt_requested=False, preemptions=workload.preemptions + int(preempted))
    if preempted and workload.kind == WorkloadKind.JOB:
        # Back to the queue, on this node: its checkpoint volume lives here.
        workload_transition(
            workload,
            to=S.QUEUED,
            allowed_from=[S.STOPPING],
            reason="preempted; queued to resume from its checkpoint",
            queued_at=now,
            pinned_node=workload.node,
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
        workload_transition(
            workload, to=S.STOPPED, allowed_from=[S.STOPPING], reason="stopped", finished_at=now, **common
        )


def agent_restart(workload_id: int) -> None:
    workload = Workload.objects.filter(pk=workload_id).first()
    if workload is None or workload.status != S.RUNNING:
        return
    launcher.container_restart(workload.container_name, grace_s=settings.INSTANCE_STOP_GRACE_S)


def agent_release(workload_id: int) -> None:
    workload = Workload.objects.filter(pk=workload_id).first()
    if workload is None or workload.status != S.RELEASING:
        return
    launcher.container_remove(workload)
    workload_transition(
        workload, to=S.RELEASED, allowed_from=[S.RELEASING], reason="released", finished_at=timezone.now()
    )


def agent_reconcile(node_name: str) -> list[int]:
    """Converge the database with what Docker has on this node; returns the workloads changed."""
    containers = launcher.containers_on_node(node_name)
    changed = []
    now = timezone.now()
    for workload in Workload.objects.filter(node__name=node_name, status=S.RUNNING):
        state = containers.get(workload.uid)
        if state is not None and state.running:
            if _over_runtime(workload, now):
                _end_over_runtime(workload)
                changed.append(workload.pk)
            continue
        to, reason, code = _outcome(workload, state)
        fields = dict(exit_code=code, finished_at=now)
        if workload.kind == WorkloadKind.JOB and state is not None:
            fields["log_tail"] = launcher.container_logs_tail(state.name)
        if workload_transition(workload, to=to, allowed_from=[S.RUNNING], reason=reason, **fields):
            changed.append(workload.pk)
            if workload.kind == WorkloadKind.JOB and state is not None:
                launcher.container_delete(state.name)  # logs are kept; the checkpoint volume stays
    # Containers of work that was released (or never known here) are removed.
    known = set(Workload.objects.filter(uid__in=containers).exclude(status=S.RELEASED).values_list("uid", flat=True))
    for uid, state in containers.items():
        if uid not in known:
            log.warning("removing orphan container %s", state.name)
            launcher.container_delete(state.name)
    return changed


def _outcome(workload: Workload, state) -> tuple[str, str, int | None]:
    if state is None:
        return S.FAILED, "container disappeared from the node", None
    if state.exit_code == 0:
        if workload.kind == WorkloadKind.JOB:
            return S.SUCCEEDED, "finished (exit code 0)", 0
        return S.STOPPED, "container exited (code 0)", 0
    why = "out of memory" if state.oom_killed else "killed or crashed"
    return S.FAILED, f"container exited with code {state.exit_code} ({why})", state.exit_code


def _over_runtime(workload: Workload, now) -> bool:
    return bool(
        workload.max_runtime_s
        and workload.started_at
        and (now - workload.started_at).total_seconds() > workload.max_runtime_s
    )


def _end_over_runtime(workload: Workload) -> None:
    launcher.container_stop(workload.container_name, grace_s=settings.INSTANCE_STOP_GRACE_S)
    log_tail = launcher.container_logs_tail(workload.container_name)
    workload_transition(
        workload,
        to=S.FAILED,
        allowed_from=[S.RUNNING],
        finished_at=timezone.now(),
        log_tail=log_tail,
        reason=f"stopped: exceeded its maximum runtime of {workload.max_runtime_s} s",
    )
    launcher.container_delete(workload.container_name)


def _short(exc: Exception) -> str:
    text = exc.message if isinstance(exc, ServiceError) else str(exc)
    return (text.splitlines() or [type(exc).__name__])[0][:200]


def agent_register(node_name: str) -> Node:
    """Register this host and its cards (NVML, or the simulated spec)."""
    gpus, simulated = discover(settings.GPU_BACKEND, node_name=node_name, sim_default=settings.SIM_GPU_DEFAULT)
    info = launcher.docker_client().info()
    host_cpus = os.cpu_count() or 1
    host_memory_mb = info.get("MemTotal", 0) // (1024 * 1024)
    return node_register(
        name=node_name,
        hostname=socket.gethostname(),
        # NODE_CPUS / NODE_MEMORY_MB may hold some back for the host, never promise more than it has.
        cpu_cores=_at_most(settings.NODE_CPUS, host_cpus, "NODE_CPUS"),
        memory_mb=_at_most(settings.NODE_MEMORY_MB, host_memory_mb, "NODE_MEMORY_MB"),
        gpus=gpus,
        simulated=simulated,
        nvidia_runtime="nvidia" in (info.get("Runtimes") or {}),
        docker_version=info.get("ServerVersion", ""),
    )


def _at_most(configured: int, host: int, name: str) -> int:
    if configured > host:
        log.warning("%s=%s is more than this host has (%s): advertising %s", name, configured, host, host)
    return min(configured, host) if configured else host


def heartbeat_forever(node_name: str, stop: threading.Event, *, nvml: bool) -> None:
    """Every NODE_HEARTBEAT_S until ``stop``: heartbeat, and on NVML hosts sample utilization."""
    uuids = list(Gpu.objects.filter(node__name=node_name).values_list("uuid", flat=True)) if nvml else []
    while not stop.wait(settings.NODE_HEARTBEAT_S):
        try:
            node_heartbeat(name=node_name)
            if uuids:
                utilization_record(node_name=node_name, samples=nvml_samples(uuids))
        except Exception:  # a database or driver blip must not kill the heartbeat thread
            log.exception("heartbeat of %s failed", node_name)
        finally:
            close_old_connections()


def watch_container_exits(node_name: str, stop: threading.Event) -> None:
    """Reconcile as soon as Docker reports one of this node's containers died (jobs finish, crashes)."""
    filters = {"type": "container", "event": "die", "label": f"{launcher.LABEL}.node={node_name}"}
    while not stop.is_set():
        try:
            for _ in launcher.docker_client().events(decode=True, filters=filters):
                agent_reconcile(node_name)
                close_old_connections()
                if stop.is_set():
                    return
        except Exception:  # Docker restarted or the stream broke: reconnect after a pause
            log.exception("docker event stream of %s broke; reconnecting", node_name)
            stop.wait(5)
