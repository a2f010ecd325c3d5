"""The message map (core/messages.py) and the tasks the workers register are the same routes."""

import pytest

from config.celery import app
from core.messages import ToNode, ToScheduler, node_queue, send, send_after_commit


def registered_tasks() -> set[str]:
    """The control plane's tasks and a GPU host's: what the two kinds of worker register together."""
    import agent.celery  # noqa: F401

    app.loader.import_default_modules()
    return {name for name in app.tasks if not name.startswith("celery.")}


def test_every_registered_task_is_in_the_message_map():
    assert registered_tasks() == {*ToScheduler, *ToNode}


def test_every_task_of_the_map_is_registered_under_its_member_name():
    tasks = app.tasks
    for member in [*ToScheduler, *ToNode]:
        assert tasks[member].name == member.value


@pytest.mark.parametrize("module", ["config.celery", "agent.celery"])
def test_no_task_outlives_the_brokers_visibility_timeout(module):
    """Redis gives an unacknowledged message (acks_late) to another worker after the visibility timeout: a task
    that may run longer would run twice (a move's copy, an image's commit)."""
    import importlib

    registered_tasks()
    celery = importlib.import_module(module).app
    timeout = celery.conf.broker_transport_options.get("visibility_timeout", 3600)  # kombu's Redis default
    assert celery.connection_for_write().transport_options.get("visibility_timeout", 3600) == timeout
    for name, task in celery.tasks.items():
        if name.startswith("celery."):
            continue
        limit = task.time_limit or celery.conf.task_time_limit
        assert limit is not None and limit < timeout, (name, limit, timeout)


def test_a_node_task_needs_a_node_to_go_to():
    with pytest.raises(ValueError, match="name the node"):
        send(ToNode.STOP, 1)


def test_node_queues_are_named_after_the_node():
    assert node_queue("gpu-1") == "node.gpu-1"


@pytest.mark.django_db(transaction=True)
def test_nothing_is_sent_when_the_transaction_rolls_back(monkeypatch):
    from django.db import transaction

    sent = []
    monkeypatch.setattr(app, "send_task", lambda name, **kw: sent.append((name, kw["queue"])))

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        send_after_commit(ToScheduler.SCHEDULE_TICK)
        raise Rollback
    with transaction.atomic():
        send_after_commit(ToNode.STOP, 7, node="gpu-1")
    assert sent == [(ToNode.STOP, "node.gpu-1")]


def test_slow_node_tasks_go_to_the_nodes_slow_queue_and_the_rest_to_its_own(monkeypatch):
    from core.messages import SLOW

    sent = {}
    monkeypatch.setattr(app, "send_task", lambda name, **kw: sent.__setitem__(name, kw["queue"]))
    for task in ToNode:
        send(task, 1, node="gpu-1")
    assert {task for task, queue in sent.items() if queue == "node.gpu-1.slow"} == SLOW
    assert {task for task, queue in sent.items() if queue == "node.gpu-1"} == set(ToNode) - SLOW
    # What a billing or user stop needs never waits behind an hour-long commit, pull or copy.
    assert {ToNode.STOP, ToNode.LAUNCH, ToNode.RESTART, ToNode.RELEASE, ToNode.RECONCILE}.isdisjoint(SLOW)
    assert {ToNode.IMAGE_COMMIT, ToNode.IMAGE_PULL, ToNode.DISK_GROW, ToNode.MOVE_IMPORT} <= SLOW
