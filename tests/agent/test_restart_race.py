"""A restart against the node's exit watcher, on the real Docker engine, driven in the order that hurts.

A restart stops the container and starts it again; the stop is a "die" event, on which the
exit watcher reconciles. The watcher must never take that exit for the work's end (freeing the
cards the restarted container then runs on), whichever comes first.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from agent import launcher
from agent.actions import agent_restart
from agent.reconcile import agent_reconcile
from core.errors import Conflict
from scheduler.models import Workload, WorkloadStatus
from scheduler.services.workloads import workload_restart, workload_stop
from tests.agent.test_agent import is_running, running_instance
from tests.conftest import make_node, remove_node_containers

pytestmark = pytest.mark.django_db

S = WorkloadStatus


def restart_with(monkeypatch, between):
    """The node's restart, with ``between()`` run after its stop and before its start."""

    def restart(name, *, grace_s):
        container = launcher.docker_client().containers.get(name)
        container.stop(timeout=0)
        between()
        container.start()
        return True

    monkeypatch.setattr(launcher, "container_restart", restart)


def holds_its_card(w) -> bool:
    card = w.node.gpus.get()
    return card.allocated_milli == 1000 and w.allocations.count() == 1


def test_the_exit_watcher_leaves_a_restarting_instance_to_its_restart(user, base_image, monkeypatch):
    node = make_node("sim:1xRTX3090")
    try:
        w = running_instance(user, node, base_image)
        workload_restart(w)
        # The restart's stop is the "die" event the watcher reconciles on, while the container is down.
        restart_with(monkeypatch, lambda: agent_reconcile(node.name))

        agent_restart(w.pk)

        w.refresh_from_db()
        assert w.status == S.RUNNING and not w.restarting, w.status_reason
        assert is_running(w) and holds_its_card(w)
        assert list(w.events.values_list("reason", flat=True))[-2:] == ["restart requested", "container restarted"]
    finally:
        remove_node_containers(node.name)


def test_a_watcher_that_read_docker_before_a_restart_began_and_ended_changes_nothing(user, base_image, monkeypatch):
    node = make_node("sim:1xRTX3090")
    try:
        w = running_instance(user, node, base_image)
        snapshot = {}
        workload_restart(w)
        # The watcher reads Docker while the restart has the container down ...
        restart_with(monkeypatch, lambda: snapshot.update(launcher.containers_on_node(node.name)))
        agent_restart(w.pk)  # ... then the restart ends before the watcher reads the database.
        monkeypatch.undo()
        assert not snapshot[w.uid].running
        monkeypatch.setattr(launcher, "containers_on_node", lambda name: dict(snapshot))

        agent_reconcile(node.name)

        w.refresh_from_db()
        assert w.status == S.RUNNING, w.status_reason
        monkeypatch.undo()
        assert is_running(w) and holds_its_card(w)
    finally:
        remove_node_containers(node.name)


def test_a_restart_whose_work_was_stopped_meanwhile_leaves_no_container_running(user, base_image, monkeypatch):
    node = make_node("sim:1xRTX3090")
    try:
        w = running_instance(user, node, base_image)
        workload_restart(w)

        def stopped_meanwhile():
            workload_stop(Workload.objects.get(pk=w.pk))
            Workload.objects.filter(pk=w.pk).update(status=S.STOPPED)  # the node's stop task recorded it

        restart_with(monkeypatch, stopped_meanwhile)

        agent_restart(w.pk)

        w.refresh_from_db()
        assert w.status == S.STOPPED and not w.restarting
        assert not is_running(w)
    finally:
        remove_node_containers(node.name)


def test_a_second_restart_is_refused_while_one_is_under_way(user, base_image):
    node = make_node("sim:1xRTX3090")
    try:
        w = running_instance(user, node, base_image)
        workload_restart(w)

        with pytest.raises(Conflict, match="restarting already"):
            workload_restart(Workload.objects.get(pk=w.pk))
    finally:
        remove_node_containers(node.name)


def test_a_restart_whose_task_died_is_settled_from_docker_after_the_deadline(user, base_image, settings):
    node = make_node("sim:1xRTX3090")
    try:
        w = running_instance(user, node, base_image)
        workload_restart(w)
        launcher.docker_client().containers.get(w.container_name).stop(timeout=0)  # its task died half way
        agent_reconcile(node.name)
        w.refresh_from_db()
        assert w.status == S.RUNNING and w.restarting  # within the deadline: left to its restart

        Workload.objects.filter(pk=w.pk).update(
            status_changed_at=timezone.now() - timedelta(seconds=settings.TRANSITION_DEADLINE_S + 1)
        )
        agent_reconcile(node.name)

        w.refresh_from_db()
        assert w.status in (S.STOPPED, S.FAILED) and not w.restarting, w.status_reason
        assert w.node.gpus.get().allocated_milli == 0
    finally:
        remove_node_containers(node.name)
