"""A node agent cut off from the control plane stops its jobs before the control plane gives them away.

The control plane requeues a silent node's jobs elsewhere after
``NODE_LOST_AFTER_S`` (``scheduler.services.node_loss``). The agent cannot tell
a cut network from a control plane that is down, so once it has not managed to
heartbeat for ``SELF_FENCE_AFTER_S`` it stops every job container of its node
(SIGTERM, ``PREEMPTION_GRACE_S`` to checkpoint, all at once) — settings make
that finish before the control plane's deadline, so a requeued job never runs
twice. It writes down which jobs it stopped and when (on the database's clock,
from the offset measured at its last heartbeat), in a file that outlives the
agent, and reports them when it can reach the database again: each becomes
queued to resume from its checkpoint on this node, its run metered up to the
moment it was really stopped. If the control plane requeued them meanwhile (the
node was lost) the report changes nothing.

With the shared storage on, jobs checkpoint there (their AUTO_TMPDIR), and a
host cut off from the control plane is mostly cut off from its metadata service
too: a job's write then hangs in the kernel, where no signal ends it, and would
land once the network returns — after the job resumed elsewhere from the same
folder. So while it stops its jobs the fence asks the mount a question; no
answer within ``FENCE_PROBE_S`` and it kills the host's JuiceFS client
(``agent.sharedfs.client_drop_if_stuck``): the writes fail, the jobs end, and
nothing the client held lands later.

Interactive instances are not stopped: a user's session should survive a
control-plane outage. They keep running and are re-adopted when contact
returns, metered for the whole time they ran (their meter stays open).

The watchdog runs in its own thread and needs only the local Docker engine: a
heartbeat blocked on a dead connection cannot delay it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from django.conf import settings

from agent import launcher
from agent import sharedfs as host_fs
from core.clock import AgentClock
from scheduler import sharedfs
from scheduler.models import MemberStatus, Node, Workload, WorkloadKind, WorkloadMember, WorkloadStatus
from scheduler.services.gangs import member_stopped
from scheduler.services.lifecycle import workload_transition

log = logging.getLogger(__name__)
S = WorkloadStatus
# How long the fence waits for the shared storage's mount to answer one lookup (milliseconds when it is up).
FENCE_PROBE_S = 1.0


class SelfFence:
    """Contact with the control plane, and the jobs stopped while it was gone."""

    def __init__(self, node_name: str, clock: AgentClock, *, state_dir: Path | None = None) -> None:
        self.node_name = node_name
        self.clock = clock
        self._path = Path(state_dir or settings.AGENT_STATE_DIR) / node_name / "self-fenced.json"
        self._lock = threading.Lock()
        self._last_contact = time.monotonic()
        self.cut_off = False

    # --- contact ------------------------------------------------------------------------------
    def contact(self) -> None:
        """The database answered (a heartbeat went through)."""
        with self._lock:
            self._last_contact = time.monotonic()
            if self.cut_off:
                log.warning("node %s reaches the control plane again", self.node_name)
            self.cut_off = False

    def silent_for(self) -> float:
        with self._lock:
            return time.monotonic() - self._last_contact

    # --- the watchdog -------------------------------------------------------------------------
    def check(self) -> list[int]:
        """Fence this node's jobs once it has been cut off long enough; returns the workloads stopped now."""
        if self.silent_for() < settings.SELF_FENCE_AFTER_S:
            return []
        with self._lock:
            first = not self.cut_off
            self.cut_off = True
        if first:
            log.error(
                "node %s has not reached the control plane for %.0f s: stopping its jobs before they are "
                "requeued elsewhere (instances keep running)",
                self.node_name,
                self.silent_for(),
            )
        return self.fence_jobs()

    def fence_jobs(self) -> list[int]:
        """Stop every running job container of this node (SIGTERM, the grace period), all at once."""
        jobs = [c for c in launcher.containers_on_node(self.node_name).values() if c.running and c.kind == "job"]
        if not jobs:
            return []

        def stop(container) -> tuple[int, float]:
            launcher.container_stop(container.name, grace_s=settings.PREEMPTION_GRACE_S)
            return container.workload_id, time.time()

        # Written down before the first SIGTERM, so that no reconcile in between reads an exit as a crash;
        # then with the moment each really stopped (its meter ends there).
        self._remember({c.workload_id: self.clock.to_db(time.time()).isoformat() for c in jobs})
        with ThreadPoolExecutor(max_workers=min(len(jobs), 16) + 1) as pool:
            if sharedfs.enabled():  # meanwhile, within the grace: a job stuck in the shared storage ends too
                pool.submit(self._shared_storage_drop_if_stuck)
            stopped = list(pool.map(stop, jobs))
        self._remember({workload_id: self.clock.to_db(at).isoformat() for workload_id, at in stopped})
        log.warning("node %s stopped jobs %s while cut off", self.node_name, [w for w, _ in stopped])
        return [w for w, _ in stopped]

    @staticmethod
    def _shared_storage_drop_if_stuck() -> None:
        try:
            host_fs.client_drop_if_stuck(settings.SHARED_FS_MOUNT, wait_s=FENCE_PROBE_S)
        except Exception:  # logged; the stops go on
            log.exception("the shared storage's client could not be checked")

    def watch_forever(self, stop: threading.Event) -> None:
        while not stop.wait(1):
            try:
                self.check()
            except Exception:  # Docker blip: try again in a second, the deadline has slack
                log.exception("self-fencing check of %s failed", self.node_name)

    # --- reporting, once the database answers -------------------------------------------------
    def pending(self) -> dict[int, str]:
        with self._lock:
            try:
                return {int(k): v for k, v in json.loads(self._path.read_text()).items()}
            except FileNotFoundError:
                return {}

    def report(self) -> list[int]:
        """Record the jobs stopped while cut off as queued to resume here; returns those requeued now.

        Idempotent: a job the control plane already requeued (the node was lost) is left as it is.
        """
        from datetime import datetime

        pending = self.pending()
        if not pending:
            return []
        node = Node.objects.filter(name=self.node_name).first()
        requeued = []
        # Only work still placed here: one the control plane requeued and placed elsewhere meanwhile runs
        # there now, and is none of this node's business.
        # A gang's member here is reported stopped: the control plane stops and requeues the gang as one.
        for member in WorkloadMember.objects.filter(
            workload_id__in=pending, node_name=self.node_name, status__in=[MemberStatus.RUNNING, MemberStatus.LEAVING]
        ):
            if member_stopped(member, exit_code=None, reason=f"its host {self.node_name} lost contact and stopped it"):
                requeued.append(member.workload_id)
        for workload in Workload.objects.filter(
            pk__in=pending, kind=WorkloadKind.JOB, node__name=self.node_name, members__isnull=True
        ):
            stopped_at = datetime.fromisoformat(pending[workload.pk])
            if workload_transition(
                workload,
                to=S.QUEUED,
                allowed_from=[S.RUNNING, S.STOPPING],
                reason=f"requeued: node {self.node_name} lost contact with the control plane and stopped it; "
                "it resumes from its checkpoint",
                at=max(stopped_at, workload.status_changed_at),
                queued_at=stopped_at,
                pinned_node=None if sharedfs.enabled() else node,  # its checkpoints: the shared storage, or here
                preempt_requested=False,
                preemptions=workload.preemptions + 1,
            ):
                requeued.append(workload.pk)
        self._forget(pending)
        if requeued:
            log.warning("node %s requeued the jobs it stopped while cut off: %s", self.node_name, requeued)
        return requeued

    def is_pending(self, workload_id: int) -> bool:
        return workload_id in self.pending()

    # --- the state file -----------------------------------------------------------------------
    def _remember(self, stopped: dict[int, str]) -> None:
        with self._lock:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            current = json.loads(self._path.read_text()) if self._path.exists() else {}
            current.update({str(k): v for k, v in stopped.items()})
            tmp = self._path.with_suffix(".tmp")
            tmp.write_text(json.dumps(current))
            tmp.replace(self._path)

    def _forget(self, reported: dict[int, str]) -> None:
        with self._lock:
            if not self._path.exists():
                return
            current = json.loads(self._path.read_text())
            for key in reported:
                current.pop(str(key), None)
            if current:
                self._path.write_text(json.dumps(current))
            else:
                self._path.unlink()


def report_pending(node_name: str) -> list[int]:
    """Report what a fence of this node left to report (called before each reconcile, so that a job
    stopped while cut off is requeued, not read as crashed)."""
    return SelfFence(node_name, AgentClock()).report()
