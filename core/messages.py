"""Every message one process sends another: its name, who serves it, and the one way to send it.

The processes — web (gunicorn), WebSocket server (daphne), scheduler worker + beat,
and one node agent per GPU host — talk only through Redis: signed Celery tasks
on a queue, and channel-layer groups for what browsers watch live. This module
is the map of those routes; a sender names a task by its member here, never by
a string of its own, and each task function is registered under that member's
name (``tests/test_messages.py`` holds the two sides together).

    queue                      served by                  tasks
    settings.SCHEDULER_QUEUE   scheduler worker (+ beat)  ToScheduler: the tick, reconciliation,
                                                          billing, housekeeping, shared storage
                                                          (quotas, usage), image deletion from the
                                                          registry, node agents' replies
    node.<name>                that host's node agent     ToNode: launch, stop, restart, release,
                               (threads)                  reconcile
    node.<name>.slow           that host's slow worker    ToNode in SLOW: image pull / commit (+ push) /
                               (processes, started by     remove, disk growth, moves: minutes to hours,
                               the agent)                 each killed at its time limit; a tenant's
                                                          hour-long commit never holds a stop back

    channel-layer group        written by                 read by (message type -> handler)
    user-<id>                  a control-plane process    the owner's console pages
                               that changes a status (a   (instance.status -> instance_status)
                               host asks the scheduler
                               worker: INSTANCE_STATUS_PUSH)
    monitor.node.<name>        the host's sampler         the cluster and node monitors
    monitor.workload.<name>.<id>  host <name>'s sampler   the instance monitor, while the instance is
                                                          on that host (telemetry.sample; it follows a
                                                          move on the owner's instance.status)
    terminals-<id>             whatever ends a user's     the user's open terminals
                               access (a new password,    (terminal.revoke -> terminal_revoke)
                               deactivation, leaving a
                               team)

One route does not go through Redis: the web tier reaches a container's terminal, files and logs
over HTTP / WebSocket at its node agent's relay (``Node.relay_url``), with a signed ticket per
call; its operations and ticket are in ``core/relay.py``.

Node agents never write to the scheduler's tables they do not own: what the
control plane must record after a node did something (an image saved, a disk
grown) comes back as a ``ToScheduler`` reply naming the task to run there.
"""

from __future__ import annotations

import re
from enum import StrEnum


class ToScheduler(StrEnum):
    """Tasks of the scheduler queue (``settings.SCHEDULER_QUEUE``)."""

    SCHEDULE_TICK = "scheduler.tasks.schedule_tick"
    CLUSTER_RECONCILE = "scheduler.tasks.cluster_reconcile"
    GANG_STEP = "scheduler.tasks.gang_step"  # a gang's member changed (node agents): step the gang
    TELEMETRY_PRUNE = "scheduler.tasks.telemetry_prune"
    METER_RECONCILE = "billing.tasks.meter_reconcile"
    SETTLE_USAGE = "billing.tasks.settle_usage"
    SEGMENT_ASSIGN = "billing.tasks.segment_assign"
    SETTLE_STORAGE = "billing.tasks.settle_storage"
    SHARED_STORAGE_USAGE = "billing.tasks.shared_storage_usage"
    SHARED_STORAGE_USER = "scheduler.tasks.shared_storage_user"
    SPOT_PRICES = "billing.tasks.spot_prices"
    BILLING_ENFORCE = "billing.tasks.billing_enforce"
    LEDGER_VERIFY = "billing.tasks.ledger_verify"
    IDLE_STOP = "portal.tasks.idle_stop"
    # Job arrays: one array's budget, fallback and status after its tasks changed; all of them periodically.
    ARRAY_SUPERVISE = "portal.tasks.array_supervise"
    ARRAYS_SUPERVISE = "portal.tasks.arrays_supervise"
    RELEASE_LONG_STOPPED = "portal.tasks.release_long_stopped"
    # A saved image's deletion from the registry (sent once the web request's transaction commits).
    IMAGE_DELETE = "portal.tasks.image_delete"
    # Replies from node agents: (reply id, size, error text).
    IMAGE_SAVED = "portal.tasks.image_saved"
    IMAGE_REMOVED = "portal.tasks.image_removed"
    DISK_GROWN = "portal.tasks.disk_grown"
    # An instance on a host changed status: the control plane pushes it to its owner's pages (hosts may not).
    INSTANCE_STATUS_PUSH = "portal.tasks.instance_status_push"
    # Saves, deletions of images and disk growths that got no answer by their deadline (beat).
    OPERATIONS_OVERDUE = "portal.tasks.operations_overdue"
    # Moving a stopped instance to another host: the agents' reports (move id, fields).
    MOVE_REPORT = "scheduler.tasks.move_report"


# What a GPU host may send the control plane (core.signing refuses the rest from a host's key): the replies about
# operations sent to it (taken only from that host), a move's reports (only from its source or target), and
# nudges that make the control plane look at its own records again (a gang, a tick, an array, a meter, an
# instance's status to push to its owner's pages).
HOST_MAY_SEND = frozenset(
    {
        ToScheduler.IMAGE_SAVED,
        ToScheduler.IMAGE_REMOVED,
        ToScheduler.DISK_GROWN,
        ToScheduler.MOVE_REPORT,
        ToScheduler.GANG_STEP,
        ToScheduler.SCHEDULE_TICK,
        ToScheduler.ARRAY_SUPERVISE,
        ToScheduler.SEGMENT_ASSIGN,
        ToScheduler.SETTLE_USAGE,
        ToScheduler.INSTANCE_STATUS_PUSH,
    }
)


class ToNode(StrEnum):
    """Tasks of a node agent's queue (``node.<name>``, ``node_queue``)."""

    LAUNCH = "agent.tasks.agent_launch"
    LAUNCH_MANY = "agent.tasks.agent_launch_many"
    STOP = "agent.tasks.agent_stop"
    RESTART = "agent.tasks.agent_restart"
    RELEASE = "agent.tasks.agent_release"
    # A released job's checkpoint folder on the shared storage, removed by another host (its own is lost).
    CHECKPOINTS_REMOVE = "agent.tasks.agent_checkpoints_remove"
    RECONCILE = "agent.tasks.agent_reconcile"
    GANG_FENCE = "agent.tasks.agent_gang_fence"  # a fellow member of a gang here came or went: rewrite its way
    IMAGE_COMMIT = "agent.tasks.agent_image_commit"
    IMAGE_REMOVE = "agent.tasks.agent_image_remove"
    DISK_GROW = "agent.tasks.agent_disk_grow"
    MOVE_EXPORT = "agent.tasks.agent_move_export"  # the source: the system disk to the registry
    MOVE_IMPORT = "agent.tasks.agent_move_import"  # the target: pull it, fetch the data disk
    MOVE_CLEANUP = "agent.tasks.agent_move_cleanup"  # a copy that is not the instance's any more
    IMAGE_PULL = "agent.tasks.agent_image_pull"  # a starting work's image, then its launch again


# What can take minutes or hours goes to the node's slow queue, served by worker processes of its own
# (Celery's prefork pool, which kills a task at its hard time limit), so it never holds the threads that
# launch, stop and restart: a billing stop does not wait behind a tenant's hour-long image commit.
SLOW = frozenset(
    {
        ToNode.IMAGE_PULL,
        ToNode.IMAGE_COMMIT,
        ToNode.IMAGE_REMOVE,
        ToNode.DISK_GROW,
        ToNode.MOVE_EXPORT,
        ToNode.MOVE_IMPORT,
        ToNode.MOVE_CLEANUP,
    }
)


def is_node_name(name: str) -> bool:
    """Whether ``name`` can be a node's (``Node.name``: a slug, at most 63 characters): what its queues, its
    certificate and its Redis user are named from."""
    return re.fullmatch(r"[-a-zA-Z0-9_]{1,63}", name) is not None


def node_queue(node_name: str, *, slow: bool = False) -> str:
    return f"node.{node_name}.slow" if slow else f"node.{node_name}"


def send(task: ToScheduler | ToNode, *args, node: str | None = None, **options) -> None:
    """Send ``task`` now: to the scheduler queue, or for a ``ToNode`` task to node ``node``'s queue
    (its slow queue for a task in ``SLOW``).

    ``options`` go to Celery's ``send_task`` (``expires``, ``producer``).
    """
    from django.conf import settings

    from config.celery import app

    if isinstance(task, ToNode):
        if not node:
            raise ValueError(f"{task.name} goes to a node's queue: name the node")
        queue = node_queue(node, slow=task in SLOW)
    else:
        queue = settings.SCHEDULER_QUEUE
    # Declared by its consumers only: a queue is a Redis list pushed to by name, and a GPU host's Redis user may
    # not write the scheduler's binding (core.redis_acl).
    app.send_task(task, args=list(args), queue=queue, declare=[], **options)


def send_to_nodes(task: ToNode, *args, nodes: list[str], producer=None) -> None:
    """Send the same ``task(*args)`` to each of ``nodes``' (fast) queues, its body serialized and signed once.

    Each copy is a task message of its own (its own id, Celery's own headers), only the signed body
    is shared, so what it says must serve every node it goes to (each picks its part: the queue it
    came on, ``request.delivery_info["routing_key"]``, is ``node_queue(its node)``). A signature costs
    a third of a millisecond and Celery's ``send_task`` as much again (with declaring the queue at every
    send): the tick's launches to ~200 nodes took ~120 ms of every tick one message at a time, ~18 ms so.

    The headers are made once too, and each copy is handed to kombu's ``Producer.publish`` as Celery's
    ``send_task_message`` would hand it (the anonymous exchange, the queue's name as routing key, no
    declaring), with only its id changed: Celery's layer and its headers made again took ~4 ms of those
    ~18 ms. Each is published with Celery's retry policy, as ``send_task`` would.
    """
    from kombu.serialization import dumps
    from kombu.utils.uuid import uuid

    from config.celery import app

    conf = app.conf
    described = dict(argsrepr=f"<{task.name.lower()} for {len(nodes)} nodes>", kwargsrepr="{}")
    headers, properties, body, _ = app.amqp.as_task_v2(uuid(), task, args=list(args), **described)
    content_type, content_encoding, signed = dumps(body, serializer=conf.task_serializer)
    retry, retry_policy = conf.task_publish_retry, conf.task_publish_retry_policy
    delivery_mode = conf.task_default_delivery_mode  # kombu takes its name ("persistent") as Celery passes it
    with app.producer_or_acquire(producer) as producer:
        for node in nodes:
            task_id = uuid()
            producer.publish(
                signed,
                exchange="",
                routing_key=node_queue(node),
                headers={**headers, "id": task_id, "root_id": task_id},
                content_type=content_type,
                content_encoding=content_encoding,
                delivery_mode=delivery_mode,
                declare=[],  # Redis: a queue is a list, pushed to by name (no binding), made by its first push
                retry=retry,
                retry_policy=retry_policy,
                **{**properties, "correlation_id": task_id},
            )


def queue_node(queue: str) -> str:
    """The node whose fast queue this is: ``node_queue(name)``'s inverse."""
    return queue.removeprefix("node.")


def send_after_commit(
    task: ToScheduler | ToNode, *args, node: str | None = None, robust: bool = False, **options
) -> None:
    """Send ``task`` once the current transaction commits; nothing is sent if it rolls back.

    ``robust``: a failure to send is logged, not raised into the committed caller (for
    messages that a periodic task repeats anyway).
    """
    from django.db import transaction

    transaction.on_commit(lambda: send(task, *args, node=node, **options), robust=robust)


# Channel-layer groups and the message types sent to them (a consumer's handler is the type
# with "." replaced by "_").
INSTANCE_STATUS = "instance.status"
TELEMETRY_SAMPLE = "telemetry.sample"
TERMINAL_REVOKE = "terminal.revoke"


def user_group(user_id: int) -> str:
    return f"user-{user_id}"


def terminals_group(user_id: int) -> str:
    return f"terminals-{user_id}"


def node_group(node_name: str) -> str:
    return f"monitor.node.{node_name}"


def workload_group(node_name: str, workload_id: int) -> str:
    """A workload's live samples from host ``node_name``: named by host, so that a host's Redis user publishes to
    its own work's groups only (``core.redis_acl``)."""
    return f"monitor.workload.{node_name}.{workload_id}"
