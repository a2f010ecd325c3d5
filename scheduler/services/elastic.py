"""Resizing elastic jobs as the tick decided: a restart from checkpoint at the new size.

An elastic job (``Workload.elastic_min``..``elastic_max`` cards) is resized the way a batch job is
preempted, on the same path: SIGTERM and ``PREEMPTION_GRACE_S`` to checkpoint, then its node stops it
and queues it again (on that node, where its checkpoint volume is; a gang anywhere, its checkpoint
being on the shared storage), and the next tick places it at the size decided here (``gpu_count``),
or at its minimum if that size no longer fits. Its launch sets ``WORLD_SIZE``/``NPROC_PER_NODE`` for
its new cards, and its command resumes from the checkpoint.

Billing follows the cards held second by second: each size is its own run, and each run's meter
segment records the cards it holds (``billing.metering.meter_open``); between the stop and the
relaunch nothing is metered, as for a preemption.
"""

from core.messages import ToNode, send_after_commit
from scheduler.models import Workload, WorkloadStatus
from scheduler.services.gangs import gang_stop
from scheduler.services.lifecycle import workload_transition

S = WorkloadStatus


def workload_resize(workload: Workload, *, gpu_count: int, reason: str) -> bool:
    """Restart running elastic work at ``gpu_count`` cards (see the module). Returns False, changing
    nothing, when it is not running (it stopped or is being stopped meanwhile) or the size is outside
    its range."""
    if workload.elastic_min is None or not workload.elastic_min <= gpu_count <= workload.elastic_max:
        return False
    why = f"resizing: {reason}; restarts from its checkpoint"
    if workload.is_gang:
        if workload.status != S.RUNNING or not gang_stop(workload, reason=why, requeue=True):
            return False
        Workload.objects.filter(pk=workload.pk, status=S.STOPPING).update(gpu_count=gpu_count)
        workload.gpu_count = gpu_count
        return True
    if not workload_transition(
        workload, to=S.STOPPING, allowed_from=[S.RUNNING], reason=why, preempt_requested=True, gpu_count=gpu_count
    ):
        return False
    send_after_commit(ToNode.STOP, workload.pk, node=workload.node.name)
    return True
