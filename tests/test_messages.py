"""The message map (config/messages.py) and the tasks the workers register are the same routes."""

import pytest

from config.celery import app
from config.messages import ToNode, ToScheduler, node_queue, send, send_after_commit


def registered_tasks() -> set[str]:
    app.loader.import_default_modules()
    return {name for name in app.tasks if not name.startswith("celery.")}


def test_every_registered_task_is_in_the_message_map():
    assert registered_tasks() == {*ToScheduler, *ToNode}


def test_every_task_of_the_map_is_registered_under_its_member_name():
    tasks = app.tasks
    for member in [*ToScheduler, *ToNode]:
        assert tasks[member].name == member.value


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
