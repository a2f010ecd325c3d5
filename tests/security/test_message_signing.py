"""Celery messages are signed: a task written into Redis without the deployment's key is refused."""

import pytest
from celery import Celery
from django.conf import settings
from django.utils import timezone

from config.celery import app
from core.messages import ToNode
from scheduler.models import WorkloadStatus
from scheduler.services.allocation import Share, allocation_create
from tests.conftest import wait_status
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db(transaction=True)


def stopping_workload(user, node):
    w = workload(user, gpu_milli=500)
    card = node.gpus.first()
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 500, card.memory_mb // 2)])
    type(w).objects.filter(pk=w.pk).update(status=WorkloadStatus.STOPPING, status_changed_at=timezone.now())
    return w


def test_a_forged_unsigned_task_is_refused_and_a_signed_one_runs(user, node_worker):
    assert app.conf.task_serializer == "auth" and app.conf.accept_content == ["auth"]
    forged_target, signed_target = stopping_workload(user, node_worker), stopping_workload(user, node_worker)

    # Whoever can write to the broker (no key): the same task, serialized as plain JSON.
    forger = Celery("forger", broker=settings.CELERY_BROKER_URL)
    forger.conf.task_serializer = "json"
    forger.send_task(ToNode.STOP, args=[forged_target.pk], queue=node_worker.queue)
    app.send_task(ToNode.STOP, args=[signed_target.pk], queue=node_worker.queue)

    wait_status(signed_target, "stopped", timeout=30)  # the worker read the queue past the forged message
    forged_target.refresh_from_db()
    assert forged_target.status == WorkloadStatus.STOPPING


def test_workers_take_no_remote_control_commands(node_worker):
    """Remote control commands (shutdown, cancel_consumer, time_limit ...) are signed like tasks, and the control
    plane trusts every host's key: no worker listens for them (a ping, the harmless one, gets no answer)."""
    assert app.control.ping(timeout=1.0) == []
