"""Converging a node with the database: what Docker really has decides.

``agent_reconcile`` runs on every reconcile beat, on every container exit
(Docker events), and before a node (re)joins the cluster. It

- records the end of running work whose container stopped (exit code, logs),
  and stops jobs past their maximum runtime;
- settles work stuck in a transitional state past ``TRANSITION_DEADLINE_S``
  (its task died: worker killed, time limit, a timeout) from what Docker shows,
  and leaves work a restart claimed to that restart until the same deadline;
- fences the node: a running container whose workload is not assigned to this
  node in a holding state is stopped (its disk stays), and containers and
  volumes of released or unknown work are removed.

Docker is read first, the database second: work that starts after the read
cannot be mistaken for an orphan.
"""

import logging
import threading
import time
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections
from django.db.models import Q
from django.db.models.functions import Now

from agent import disks, gangs, hostview, launcher
from agent.actions import agent_release, agent_stop
from agent.exits import exit_reason
from agent.quarantine import Quarantine
from agent.selffence import SelfFence, report_pending
from agent.sharedfs import checkpoint_dir_remove
from core.clock import AgentClock, agent_clock, db_now
from scheduler import sharedfs
from scheduler.models import MemberStatus, Node, NodeStatus, Workload, WorkloadKind, WorkloadMember, WorkloadStatus
from scheduler.services import gangs as gang_service
from scheduler.services.lifecycle import workload_transition
from scheduler.services.nodes import node_heartbeat, node_rejoin

log = logging.getLogger(__name__)
S = WorkloadStatus


def agent_reconcile(node_name: str) -> list[int]:
    """Converge the database with what Docker has on this node; returns the workloads changed."""
    report_pending(node_name)  # jobs this node stopped while cut off: requeued, not read as crashed
    since = hostview.pins.mark()
    containers = launcher.containers_on_node(node_name)
    # Containers that ended by themselves (this reconcile follows their exit) give their cores back.
    hostview.pins.reset(node_name, {s.id: list(s.cores) for s in containers.values() if s.cores}, since=since)
    volumes = launcher.volumes_on_node(node_name)
    now = db_now()
    changed = _restarts_overdue(node_name, now)
    changed += _settle_running(node_name, containers, now)
    changed += _settle_members(node_name)
    changed += _settle_overdue(node_name, containers, now)
    _fence(node_name, containers, volumes)
    if settings.INSTANCE_NETWORK_MODE == "fenced":
        gangs.gang_rules_sync_logged(node_name)  # no member's way through the fence outlives it
    return changed


_last_periodic = {"at": float("-inf")}


def agent_reconcile_periodic(node_name: str) -> None:
    """The control plane's beat asks for a reconcile; a node that was away finds one message per beat it
    missed, and one run covers them all (no message expiry: that would compare two machines' clocks)."""
    if time.monotonic() - _last_periodic["at"] < settings.RECONCILE_S / 2:
        return
    agent_reconcile(node_name)
    _last_periodic["at"] = time.monotonic()


def _ended_at(workload: Workload, state, last_heard, now):
    """When its container ended: Docker's ``State.FinishedAt`` on the database's clock (its run's meter ends there,
    not at this reconcile, which may come much later: the agent restarting), never before the host's last heartbeat
    nor the run's start (a host cannot end its tenants' runs further in the past than it last proved alive), never
    after now. None (now) where Docker does not say."""
    if state is None or state.finished_at is None:
        return None
    floor = max(filter(None, [last_heard, workload.status_changed_at]))
    return min(max(agent_clock.to_db(state.finished_at), floor), now)


def _settle_running(node_name: str, containers: dict, now) -> list[int]:
    changed = []
    last_heard = Node.objects.filter(name=node_name).values_list("last_heartbeat", flat=True).first()
    for workload in Workload.objects.filter(node__name=node_name, status=S.RUNNING, members__isnull=True):
        if workload.restarting:
            continue  # its container's exit is its restart's (an unfinished restart expires: _restarts_overdue)
        state = containers.get(workload.uid)
        if state is None or not state.running:
            # Not running in the snapshot: its launch, or a restart, may have started the container and
            # committed between the Docker read and this database read (short jobs make that common). Ask again.
            state = launcher.container_state(workload.container_name)
        if state is not None and state.running:
            if _over_runtime(workload, now) and _end_over_runtime(workload):
                changed.append(workload.pk)
            continue
        to, reason, code = _outcome(workload, state)
        ended = _ended_at(workload, state, last_heard, now)
        fields = dict(exit_code=code, finished_at=ended or now)
        if workload.kind == WorkloadKind.JOB and state is not None:
            fields["log_tail"] = launcher.container_logs_tail(state.name)
        # Only if no restart was asked for since the row was read: that restart's container is not this one.
        unclaimed = {"restarting": False, "restarts": workload.restarts}
        if workload_transition(
            workload, to=to, allowed_from=[S.RUNNING], where=unclaimed, reason=reason, at=ended, **fields
        ):
            changed.append(workload.pk)
            if workload.kind == WorkloadKind.JOB and state is not None:
                launcher.container_delete(state.name)  # logs are kept; the checkpoint volume stays
    return changed


def _settle_members(node_name: str) -> list[int]:
    """Gang members of this node whose container ended by itself: reported (the control plane steps the gang)."""
    changed = []
    members = WorkloadMember.objects.filter(
        node_name=node_name, status__in=[MemberStatus.RUNNING, MemberStatus.LEAVING], workload__status=S.RUNNING
    ).select_related("workload")
    for member in members:
        state = launcher.container_state(member.container_name)
        if state is not None and state.running:
            continue
        if state is None:
            code, reason = None, "its container disappeared from the node"
        else:
            code, reason = state.exit_code, f"its container {exit_reason(state.exit_code, oom_killed=state.oom_killed)}"
            tail = launcher.container_logs_tail(state.name) if member.rank == 0 or code else ""
            if member.rank == 0:
                Workload.objects.filter(pk=member.workload_id).update(log_tail=tail)
            if code and (last := _last_line(tail)):
                reason += f"; its last line: {last}"  # a trace of a failed rank whose output is not the job's log
        if gang_service.member_exited(member, exit_code=code, reason=reason):
            changed.append(member.workload_id)
            if state is not None:  # as a single-node job's: its output is in the log, nothing restarts it
                launcher.container_delete(state.name)
    return changed


def _last_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")[:160]


def _outcome(workload: Workload, state) -> tuple[str, str, int | None]:
    if state is None:
        return S.FAILED, "container disappeared from the node", None
    if state.exit_code == 0:
        if workload.kind == WorkloadKind.JOB:
            return S.SUCCEEDED, "finished (exit code 0)", 0
        return S.STOPPED, "container exited (code 0)", 0
    return S.FAILED, f"container {exit_reason(state.exit_code, oom_killed=state.oom_killed)}", state.exit_code


def _over_runtime(workload: Workload, now) -> bool:
    return bool(
        workload.max_runtime_s
        and workload.started_at
        and (now - workload.started_at).total_seconds() > workload.max_runtime_s
    )


def _end_over_runtime(workload: Workload) -> bool:
    """Claim the work (running -> stopping) before touching its container, then stop it.

    The claim comes first so the exit the stop causes is not read by a concurrent
    reconcile (the Docker-events watcher) as a crash: only one of them can win it.
    """
    limit = f"exceeded its maximum runtime of {workload.max_runtime_s} s"
    if not workload_transition(workload, to=S.STOPPING, allowed_from=[S.RUNNING], reason=f"stopping: {limit}"):
        return False
    exit_code = launcher.container_stop(workload.container_name, grace_s=settings.INSTANCE_STOP_GRACE_S)
    workload_transition(
        workload,
        to=S.FAILED,
        allowed_from=[S.STOPPING],
        finished_at=Now(),
        exit_code=exit_code,
        log_tail=launcher.container_logs_tail(workload.container_name),
        reason=f"stopped: {limit}",
    )
    launcher.container_delete(workload.container_name)
    return True


def _restarts_overdue(node_name: str, now) -> list[int]:
    """End restart claims older than TRANSITION_DEADLINE_S (their task died): the work is then
    settled from what Docker shows, like any running work."""
    deadline = settings.TRANSITION_DEADLINE_S
    overdue = Workload.objects.filter(
        node__name=node_name, status=S.RUNNING, restarting=True, status_changed_at__lt=now - timedelta(seconds=deadline)
    )
    changed = []
    for workload in overdue:
        log.warning("the restart of workload %s did not finish within %s s; settling it", workload.pk, deadline)
        if workload_transition(
            workload,
            to=S.RUNNING,
            allowed_from=[S.RUNNING],
            where={"restarting": True, "restarts": workload.restarts},
            reason=f"its restart did not finish within {deadline} s",
            restarting=False,
        ):
            changed.append(workload.pk)
    return changed


def _settle_overdue(node_name: str, containers: dict, now) -> list[int]:
    """Work whose node task died in a transitional state: finish the move from what Docker shows."""
    deadline = settings.TRANSITION_DEADLINE_S
    overdue = Workload.objects.filter(
        Q(node__name=node_name) | Q(node__isnull=True, pinned_node__name=node_name),
        status__in=S.transitional(),
        status_changed_at__lt=now - timedelta(seconds=deadline),
        members__isnull=True,  # a gang's overdue start or stop is the control plane's to settle (gangs)
    )
    changed = []
    for workload in overdue:
        log.warning("workload %s has been %s for over %s s; settling it", workload.pk, workload.status, deadline)
        if workload.status == S.STOPPING:
            agent_stop(workload.pk)  # idempotent: stops the container if it still runs, records the end
        elif workload.status == S.RELEASING:
            agent_release(workload.pk)
        else:
            state = containers.get(workload.uid)
            if state is not None and state.running:
                workload_transition(
                    workload,
                    to=S.RUNNING,
                    allowed_from=[S.STARTING],
                    reason="container running (confirmed by reconciliation)",
                    container_id=state.id,
                    started_at=now,
                )
            else:
                workload_transition(
                    workload,
                    to=S.FAILED,
                    allowed_from=[S.STARTING],
                    reason=f"failed to start: its launch did not finish within {deadline} s; start it again",
                    finished_at=now,
                )
        changed.append(workload.pk)
    return changed


def unknown_kept(unknown: int, total: int) -> bool:
    """Whether this host's containers and disks of work the database does not know at all are kept this pass:
    more than ORPHAN_MAX_UNKNOWN of them and more than ORPHAN_MAX_UNKNOWN_PERCENT of all of them is not a few
    leftovers but a database that is not this host's (restored from a backup, another deployment's)."""
    return unknown > settings.ORPHAN_MAX_UNKNOWN and unknown * 100 > total * settings.ORPHAN_MAX_UNKNOWN_PERCENT


def _fence(node_name: str, containers: dict, volumes: dict) -> None:
    """Stop what may not run here; remove what belongs to no live work, and gang members left behind."""
    here = {*containers, *volumes}
    owners = {w.uid: w for w in Workload.objects.filter(uid__in=here).select_related("node")}
    unknown = here - owners.keys()
    keep_unknown = unknown_kept(len(unknown), len(here))
    if keep_unknown:
        log.error(
            "%d of the %d workloads with a container or disk on this node are unknown to the database: none of "
            "theirs is removed (was the database restored from a backup, or is this DEPLOYMENT_ID another's?); "
            "ORPHAN_MAX_UNKNOWN / ORPHAN_MAX_UNKNOWN_PERCENT say when leftovers are removed",
            len(unknown),
            len(here),
        )
    # A few unknown ones: held in quarantine (stopped), removed once unknown for ORPHAN_QUARANTINE_S.
    expired = set() if keep_unknown else Quarantine(node_name).hold(unknown)
    holding = set(S.holding_resources())
    members = {
        m.workload_id: m for m in WorkloadMember.objects.filter(node_name=node_name, workload__uid__in=containers)
    }
    live = MemberStatus.live()
    for uid, state in containers.items():
        workload = owners.get(uid)
        member = members.get(workload.pk) if workload is not None else None
        if member is not None:
            member.workload = workload
        if workload is None and keep_unknown:
            continue
        if workload is None and uid not in expired:
            if state.running:
                log.warning("stopping container %s of work the database does not know (quarantined)", state.name)
                launcher.container_stop(state.name, grace_s=settings.INSTANCE_STOP_GRACE_S)
            continue
        if workload is None or workload.status == S.RELEASED:
            log.warning("removing orphan container %s", state.name)
            launcher.container_delete(state.name)
        elif _left_behind(workload, member, state, node_name):
            # A job's container of an earlier placement: a gang's member that now runs on other nodes (or this
            # node under another rank), or single-node work requeued when this host was lost. Its output is in
            # the log, its checkpoints on a volume or the shared storage. By id: a launch here after this read
            # may reuse the name.
            log.warning("removing container %s: its %s has left this node", state.name, workload.kind)
            if state.running:
                launcher.container_stop(state.id, grace_s=settings.INSTANCE_STOP_GRACE_S)
            launcher.container_delete(state.id)
        elif state.running and member is not None and member.status in live and workload.status in holding:
            continue  # a live member of a gang here
        elif not state.running and member is not None and member.status not in live:
            # A member that ended (exited, or stopped with its gang) and was not removed then: its output is in
            # the log, a new placement starts a new container.
            launcher.container_delete(state.id)
        elif state.running and not (workload.status in holding and workload.node and workload.node.name == node_name):
            # Work that was lost, requeued elsewhere or stopped while this node was away: its disk stays.
            log.warning(
                "stopping container %s: its %s is %s, not running here", state.name, workload.kind, workload.status
            )
            launcher.container_stop(state.name, grace_s=settings.INSTANCE_STOP_GRACE_S)
    for uid, name in volumes.items():
        workload = owners.get(uid)
        if workload is None and (keep_unknown or uid not in expired):
            continue
        if workload is None or workload.status == S.RELEASED:
            log.warning("removing orphan volume %s", name)
            launcher.volume_delete(name)
            if workload is not None and workload.kind == WorkloadKind.JOB and sharedfs.enabled():
                checkpoint_dir_remove(workload.owner_id, workload.uid)  # released while this host was lost


def _left_behind(workload: Workload, member: WorkloadMember | None, state, node_name: str) -> bool:
    """Whether the container is a job's that no longer belongs here: not the container of its work's member
    on this node (rows of the last placement, kept while it waits in the queue), nor the container of
    single-node work placed here (last). Only a job's: a job starts afresh each run, an instance's container
    is its disk."""
    if workload.kind != WorkloadKind.JOB:
        return False
    if member is not None:
        return state.name != member.container_name
    if workload.is_gang or state.name != workload.container_name:
        return True
    return workload.node is None or workload.node.name != node_name  # requeued while this host was away


def watch_container_exits(node_name: str, stop: threading.Event) -> None:
    """Reconcile as soon as Docker reports one of this node's containers died (jobs finish, crashes)."""
    filters = {"type": "container", "event": "die", "label": f"{launcher.LABEL}.node={node_name}"}
    while not stop.is_set():
        try:
            for _ in launcher.docker_client().events(decode=True, filters=filters):
                try:
                    agent_reconcile(node_name)
                except Exception:  # one failed reconcile must not end the event stream
                    log.exception("reconcile of %s after a container exit failed", node_name)
                finally:
                    close_old_connections()
                if stop.is_set():
                    return
        except Exception:  # Docker restarted or the stream broke: reconnect after a pause
            log.exception("docker event stream of %s broke; reconnecting", node_name)
            stop.wait(5)


def heartbeat_forever(
    node_name: str,
    epoch: int,
    stop: threading.Event,
    *,
    fence: SelfFence | None = None,
    clock: AgentClock | None = None,
    on_superseded=None,
) -> None:
    """Every NODE_HEARTBEAT_S until ``stop``: heartbeat (GPU sampling is ``sampler.py``'s own loop).

    Each heartbeat that goes through is contact for the self-fence (``fence``),
    measures the offset to the database's clock (``clock``) and reports the jobs
    a fence stopped while contact was lost. A node the control plane marked lost
    fences itself (stops every container not assigned to it) before it rejoins.
    A heartbeat refused because a newer agent registered this node (a higher
    epoch), or because an operator removed it, ends this loop and calls
    ``on_superseded`` (the agent command shuts its worker down).
    """
    while not stop.wait(settings.NODE_HEARTBEAT_S):
        try:
            status = node_heartbeat(name=node_name, epoch=epoch, disk=disks.host_disk_gb(launcher.docker_root))
            if clock is not None:
                clock.measure()
            if fence is not None:
                fence.contact()
                fence.report()
            if status in (None, NodeStatus.REMOVED):
                why = "was registered by a newer agent" if status is None else "was removed by an operator"
                log.error("node %s %s: this agent stops", node_name, why)
                stop.set()
                if on_superseded is not None:
                    on_superseded()
                return
            if status == NodeStatus.LOST:
                log.warning("node %s was marked lost: fencing its containers before it rejoins", node_name)
                agent_reconcile(node_name)
                node_rejoin(name=node_name, epoch=epoch)
        except Exception:  # a database or driver blip must not kill the heartbeat thread
            log.exception("heartbeat of %s failed", node_name)
        finally:
            close_old_connections()
