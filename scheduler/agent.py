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

from scheduler import launcher
from scheduler.gpus import discover
from scheduler.lifecycle import workload_transition
from scheduler.models import Allocation, Node, Workload, WorkloadStatus
from scheduler.nodes import node_heartbeat, node_register

log = logging.getLogger(__name__)
S = WorkloadStatus


def _shares(workload: Workload) -> list[launcher.CardShare]:
    allocations = Allocation.objects.filter(workload=workload).select_related("gpu").order_by("gpu__index")
    return [launcher.CardShare(a.gpu.uuid, a.milli, a.memory_mb) for a in allocations]


def agent_launch(workload_id: int) -> None:
    workload = Workload.objects.select_related("node").filter(pk=workload_id).first()
    if workload is None or workload.status != S.STARTING:
        return
    spec = launcher.container_spec(workload, node=workload.node, shares=_shares(workload))
    try:
        container_id = launcher.container_launch(workload, spec)
    except docker.errors.DockerException as exc:
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
    workload = Workload.objects.filter(pk=workload_id).first()
    if workload is None or workload.status != S.STOPPING:
        return
    try:
        exit_code = launcher.container_stop(workload.container_name, grace_s=settings.INSTANCE_STOP_GRACE_S)
    except docker.errors.DockerException as exc:
        workload_transition(
            workload,
            to=S.FAILED,
            allowed_from=[S.STOPPING],
            reason=f"failed to stop: {_short(exc)}",
            finished_at=timezone.now(),
        )
        return
    workload_transition(
        workload,
        to=S.STOPPED,
        allowed_from=[S.STOPPING],
        reason="stopped",
        exit_code=exit_code,
        finished_at=timezone.now(),
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
    for workload in Workload.objects.filter(node__name=node_name, status=S.RUNNING):
        state = containers.get(workload.uid)
        if state is not None and state.running:
            continue
        if state is None:
            to, reason, code = S.FAILED, "container disappeared from the node", None
        elif state.exit_code == 0:
            to, reason, code = S.STOPPED, "container exited (code 0)", 0
        else:
            why = "out of memory" if state.oom_killed else "killed or crashed"
            to, reason, code = S.FAILED, f"container exited with code {state.exit_code} ({why})", state.exit_code
        if workload_transition(
            workload, to=to, allowed_from=[S.RUNNING], reason=reason, exit_code=code, finished_at=timezone.now()
        ):
            changed.append(workload.pk)
    # Containers of work that was released (or never known here) are removed.
    known = set(Workload.objects.filter(uid__in=containers).exclude(status=S.RELEASED).values_list("uid", flat=True))
    for uid, state in containers.items():
        if uid not in known:
            log.warning("removing orphan container %s", state.name)
            launcher.docker_client().containers.get(state.name).remove(force=True)
    return changed


def _short(exc: Exception) -> str:
    return str(exc).splitlines()[0][:200]


def agent_register(node_name: str) -> Node:
    """Register this host and its cards (NVML, or the simulated spec)."""
    gpus, simulated = discover(settings.GPU_BACKEND, node_name=node_name, sim_default=settings.SIM_GPU_DEFAULT)
    client = launcher.docker_client()
    info = client.info()
    return node_register(
        name=node_name,
        hostname=socket.gethostname(),
        cpu_cores=settings.NODE_CPUS or os.cpu_count() or 1,
        memory_mb=settings.NODE_MEMORY_MB or info.get("MemTotal", 0) // (1024 * 1024),
        gpus=gpus,
        simulated=simulated,
        nvidia_runtime="nvidia" in (info.get("Runtimes") or {}),
        docker_version=info.get("ServerVersion", ""),
    )


def heartbeat_forever(node_name: str, stop: threading.Event) -> None:
    """Heartbeat every NODE_HEARTBEAT_S until ``stop`` is set (runs in a thread of the agent)."""
    while not stop.wait(settings.NODE_HEARTBEAT_S):
        try:
            node_heartbeat(name=node_name)
        except Exception:  # a database blip must not kill the heartbeat thread
            log.exception("heartbeat of %s failed", node_name)
        finally:
            close_old_connections()
