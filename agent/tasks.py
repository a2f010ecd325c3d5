"""Node-queue Celery tasks (queue ``node.<name>``): take ids and call the node agent.

Each is registered under its name in ``core.messages.ToNode``, which is how
the control plane sends them without importing node-side code.
"""

from celery import shared_task
from django.conf import settings

from agent import actions, gangs, moves, reconcile
from core.messages import ToNode, queue_node, send

NODE_TASK = dict(ignore_result=True, acks_late=True, max_retries=0)


def limits(seconds: int) -> dict:
    """A slow task's hard time limit (its worker process is killed then) and a soft one a little earlier
    (the task says it ran out of time, and answers)."""
    return dict(time_limit=seconds, soft_time_limit=max(1, seconds - max(1, min(60, seconds // 10))))


@shared_task(name=ToNode.LAUNCH, **NODE_TASK)
def agent_launch(workload_id: int, node_name: str | None = None):
    """``node_name``: the node of the gang's member to launch; a single-node launch has none (this agent's)."""
    actions.agent_launch(workload_id, node_name)


@shared_task(name=ToNode.LAUNCH_MANY, ignore_result=True, bind=True)
def agent_launch_many(self, launches: dict[str, list[int]]):
    """The tick's launches: ``launches`` names them for several nodes (one signed body, a copy on each
    node's queue, ``core.messages.send_to_nodes``) and this node launches its part, known by the queue
    the message came on.

    The first is launched here and now, each of the others becomes its own launch task (so they run
    side by side on the agent's threads). A launch lost with this task is sent again by the control
    plane's reconciliation (LAUNCH_RESEND_S)."""
    node_name = queue_node(self.request.delivery_info["routing_key"])
    first, *others = launches.get(node_name) or [None]
    for workload_id in others:
        send(ToNode.LAUNCH, workload_id, node_name, node=node_name)
    if first is not None:
        actions.agent_launch(first, node_name)


@shared_task(name=ToNode.STOP, **NODE_TASK)
def agent_stop(workload_id: int, node_name: str | None = None):
    actions.agent_stop(workload_id, node_name)


@shared_task(name=ToNode.RESTART, **NODE_TASK)
def agent_restart(workload_id: int):
    actions.agent_restart(workload_id)


@shared_task(name=ToNode.RELEASE, **NODE_TASK)
def agent_release(workload_id: int):
    actions.agent_release(workload_id)


@shared_task(name=ToNode.CHECKPOINTS_REMOVE, **NODE_TASK)
def agent_checkpoints_remove(owner_id: int, uid: str):
    actions.agent_checkpoints_remove(owner_id, uid)


# The slow queue's tasks (core.messages.SLOW): run by processes that are killed at the hard limit.
# Committing a large disk takes longer than the default task limit (the control plane's deadline for
# the answer, IMAGE_SAVE_DEADLINE_S, is longer still).
@shared_task(name=ToNode.IMAGE_COMMIT, **NODE_TASK, **limits(settings.IMAGE_SAVE_TIME_LIMIT_S))
def agent_image_commit(workload_id: int, ref: str, reply_to: str, reply_id: int):
    actions.agent_image_commit(workload_id, ref, reply_to, reply_id)


# Within the launch's own deadline (TRANSITION_DEADLINE_S): the default limit.
@shared_task(name=ToNode.IMAGE_PULL, **NODE_TASK)
def agent_image_pull(workload_id: int, node_name: str | None = None):
    """``node_name``: the node of the gang's member to pull for; a single-node pull has none (this host's)."""
    actions.agent_image_pull(workload_id, node_name)


@shared_task(name=ToNode.IMAGE_REMOVE, **NODE_TASK)
def agent_image_remove(ref: str, reply_to: str, reply_id: int):
    actions.agent_image_remove(ref, reply_to, reply_id)


@shared_task(name=ToNode.DISK_GROW, **NODE_TASK, **limits(settings.DISK_GROW_TIME_LIMIT_S))
def agent_disk_grow(workload_id: int, size_gb: int, reply_to: str, reply_id: int):
    actions.agent_disk_grow(workload_id, size_gb, reply_to, reply_id)


@shared_task(name=ToNode.GANG_FENCE, **NODE_TASK)
def agent_gang_fence():
    if settings.INSTANCE_NETWORK_MODE == "fenced":
        gangs.gang_rules_sync_logged(settings.NODE_NAME)


@shared_task(name=ToNode.RECONCILE, ignore_result=True)
def agent_reconcile(node_name: str):
    reconcile.agent_reconcile_periodic(node_name)


# Copying a data disk takes as long as it takes (the relay's own limit, MOVE_TRANSFER_TIMEOUT_S, bounds it).
@shared_task(name=ToNode.MOVE_EXPORT, **NODE_TASK, **limits(settings.MOVE_EXPORT_TIME_LIMIT_S))
def agent_move_export(move_id: int):
    moves.agent_move_export(move_id)


@shared_task(name=ToNode.MOVE_IMPORT, **NODE_TASK, **limits(settings.MOVE_IMPORT_TIME_LIMIT_S))
def agent_move_import(move_id: int, capability: str = ""):
    moves.agent_move_import(move_id, capability)


@shared_task(name=ToNode.MOVE_CLEANUP, **NODE_TASK)
def agent_move_cleanup(move_id: int, side: str):
    moves.agent_move_cleanup(move_id, side)
