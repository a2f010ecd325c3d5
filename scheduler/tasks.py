"""Celery tasks: thin wrappers that take ids and call the scheduler's services or agent.

Scheduler tasks run on the ``scheduler`` queue; workload tasks are sent to the
queue of the node that holds the work (``node.<name>``).
"""

from datetime import timedelta

from celery import shared_task
from django.conf import settings

from scheduler import agent, tick
from scheduler.models import Node, NodeStatus
from scheduler.nodes import nodes_mark_lost

NODE_TASK = dict(ignore_result=True, acks_late=True, max_retries=0)


@shared_task(ignore_result=True)
def schedule_tick():
    tick.schedule_tick()


@shared_task(ignore_result=True)
def cluster_reconcile():
    nodes_mark_lost(silent_for=timedelta(seconds=settings.NODE_LOST_AFTER_S))
    for node in Node.objects.filter(status=NodeStatus.ACTIVE):
        node_reconcile.apply_async(args=[node.name], queue=node.queue, expires=settings.NODE_LOST_AFTER_S)


@shared_task(**NODE_TASK)
def workload_launch(workload_id: int):
    agent.agent_launch(workload_id)


@shared_task(**NODE_TASK)
def workload_stop(workload_id: int):
    agent.agent_stop(workload_id)


@shared_task(**NODE_TASK)
def workload_restart(workload_id: int):
    agent.agent_restart(workload_id)


@shared_task(**NODE_TASK)
def workload_release(workload_id: int):
    agent.agent_release(workload_id)


@shared_task(ignore_result=True)
def node_reconcile(node_name: str):
    agent.agent_reconcile(node_name)
