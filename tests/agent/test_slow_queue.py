"""The node's slow queue: what takes minutes or hours runs on worker processes of its own, which end
every task at its time limit, and a launch's image pull goes there too."""

import contextlib
import functools
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from django.conf import settings

from agent import actions, launcher
from agent import tasks as node_tasks
from agent.slowworker import SlowWorker, _die_with_parent
from core.messages import ToNode
from portal.models import Instance
from portal.services import work
from scheduler.models import MemberStatus, WorkloadEvent, WorkloadStatus
from scheduler.registry import RegistryError
from scheduler.services.allocation import Part, Placement, Share, allocation_create, allocations_create
from scheduler.services.gangs import gang_member_on
from tests.conftest import database_url, make_node, wait_for, worker_for
from tests.portal.test_operation_deadlines import stopped_instance
from tests.scheduler.factories import workload

S = WorkloadStatus


@contextlib.contextmanager
def hanging_growth(instance, tmp_path):
    """A real slow worker for the instance's node, on which growing its data disk hangs in an e2fsck
    that never returns (the disk is grown offline here); yields the worker and the file that will
    hold e2fsck's process id."""
    volumes, tools, pid_file = tmp_path / "volumes", tmp_path / "bin", tmp_path / "e2fsck.pid"
    volumes.mkdir()
    tools.mkdir()
    (volumes / f"{instance.workload.volume_name}.img").write_bytes(b"")
    hanging = tools / "e2fsck"
    hanging.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 3600\n")
    hanging.chmod(0o755)
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "SCHEDULER_QUEUE": settings.SCHEDULER_QUEUE,
        "DEPLOYMENT_ID": settings.DEPLOYMENT_ID,
        "INSTANCE_DISK_QUOTA": "true",
        "VOLUMES_DIR": str(volumes),
        "PATH": f"{tools}:{os.environ['PATH']}",
    }
    stop = threading.Event()
    with open(tmp_path / "slow-worker.log", "w") as log:
        slow = SlowWorker(instance.workload.node.name, concurrency=1, stdout=log, env=env)
        thread = threading.Thread(target=slow.run_forever, args=(stop,), daemon=True)
        thread.start()
        try:
            with worker_for():  # the scheduler queue, where the node's answer goes
                yield slow, pid_file
        finally:
            stop.set()
            slow.stop()
            thread.join(30)
            if pid_file.exists() and Path(f"/proc/{pid_file.read_text().strip()}").exists():
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def with_limits(monkeypatch, *, hard: int, soft: int) -> None:
    """A message carries its task's time limits as the sender defines the task."""
    monkeypatch.setattr(node_tasks.agent_disk_grow, "time_limit", hard)
    monkeypatch.setattr(node_tasks.agent_disk_grow, "soft_time_limit", soft)
    # Celery caches a task's options (time limits among them) at its first send: an earlier test's send
    # would otherwise keep the real limits in this one's message.
    monkeypatch.setattr(node_tasks.agent_disk_grow, "_exec_options", None)


@pytest.mark.django_db(transaction=True)
def test_a_slow_operation_that_hangs_is_ended_at_its_time_limit_and_answers_so(user, catalog, tmp_path, monkeypatch):
    with_limits(monkeypatch, hard=4, soft=3)
    instance = stopped_instance(user, catalog)
    with hanging_growth(instance, tmp_path) as (slow, pid_file):
        work.instance_grow_disk(instance=instance, disk_gb=20)
        wait_for(
            lambda: Instance.objects.get(pk=instance.pk).disk_growing_to is None,
            timeout=90,
            what="the slow worker's answer",
        )
        pid = int(pid_file.read_text())

    reason = WorkloadEvent.objects.filter(workload=instance.workload).latest("id").reason
    assert reason == "growing the data disk to 20 GB failed: it did not finish within its time limit"
    assert not Path(f"/proc/{pid}").exists()  # what the task started did not outlive it either
    assert slow.process.poll() is not None  # and the worker stopped with the agent


def starting(user, image_ref: str):
    node = make_node("sim:1xRTX3090")
    w = workload(user, image_ref=image_ref)
    card = node.gpus.get()
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    w.refresh_from_db()
    assert w.status == S.STARTING
    return w


@pytest.mark.django_db
def test_a_launch_whose_image_is_not_on_the_host_hands_the_pull_to_the_slow_queue(user, monkeypatch):
    sent = []
    monkeypatch.setattr(actions, "send", lambda task, *args, node: sent.append((task, args, node)))
    w = starting(user, "gpucloud-test/not-here:1")

    actions.agent_launch(w.pk)

    assert sent == [(ToNode.IMAGE_PULL, (w.pk,), w.node.name)]
    w.refresh_from_db()
    assert w.status == S.STARTING and not w.runs.exists()  # nothing begun on the fast queue

    monkeypatch.setattr(launcher, "image_pull", lambda ref: None)
    actions.agent_image_pull(w.pk)  # pulled: the launch goes back to the node's queue
    assert sent[-1] == (ToNode.LAUNCH, (w.pk,), w.node.name)


@pytest.mark.django_db
def test_a_pull_that_fails_fails_the_launch_saying_why(user, monkeypatch):
    monkeypatch.setattr(actions, "send", lambda *args, **kwargs: None)

    def refused(ref):
        raise RegistryError(f"cannot pull image {ref} from the registry r:5000: unauthorized")

    monkeypatch.setattr(launcher, "image_pull", refused)
    w = starting(user, "r:5000/gpucloud-saved:x")

    actions.agent_image_pull(w.pk)

    w.refresh_from_db()
    assert w.status == S.FAILED and w.status_reason.endswith("unauthorized")
    assert w.node.gpus.get().allocated_milli == 0


def starting_gang(user, image_ref: str):
    """A gang of two starting members, rank 1 on the second node."""
    a, b = make_node("sim:1xRTX3090"), make_node("sim:1xRTX3090")
    w = workload(user, kind="job", gpu_count=2, image_ref=image_ref)
    card_a, card_b = a.gpus.get(), b.gpus.get()
    placement = Placement(
        w, a.pk, [Share(card_a.pk, 1000, card_a.memory_mb)], rest=(Part(b.pk, [Share(card_b.pk, 1000, 1)]),)
    )
    assert allocations_create([placement])
    w.refresh_from_db()
    assert w.status == S.STARTING and w.is_gang
    return w, gang_member_on(w, b.name)


@pytest.mark.django_db
def test_a_gang_members_launch_whose_image_is_not_on_the_host_hands_the_pull_to_the_slow_queue(user, monkeypatch):
    sent = []
    monkeypatch.setattr(actions, "send", lambda task, *args, node: sent.append((task, args, node)))
    monkeypatch.setattr(launcher, "image_pull", lambda ref: pytest.fail("pulled on the agent's own threads"))
    w, rank1 = starting_gang(user, "gpucloud-test/not-here:1")

    actions.agent_launch(w.pk, rank1.node_name)

    assert sent == [(ToNode.IMAGE_PULL, (w.pk, rank1.node_name), rank1.node_name)]
    rank1.refresh_from_db()
    assert rank1.status == MemberStatus.STARTING and not w.runs.exists()

    monkeypatch.setattr(launcher, "image_pull", lambda ref: None)
    actions.agent_image_pull(w.pk, rank1.node_name)  # pulled: this member's launch goes back to its node's queue
    assert sent[-1] == (ToNode.LAUNCH, (w.pk, rank1.node_name), rank1.node_name)


@pytest.mark.django_db
def test_a_gang_members_pull_that_fails_is_that_members_failure_saying_why(user, monkeypatch):
    monkeypatch.setattr(actions, "send", lambda *args, **kwargs: None)

    def refused(ref):
        raise RegistryError(f"cannot pull image {ref} from the registry r:5000: unauthorized")

    monkeypatch.setattr(launcher, "image_pull", refused)
    w, rank1 = starting_gang(user, "r:5000/gpucloud-saved:x")

    actions.agent_image_pull(w.pk, rank1.node_name)

    rank1.refresh_from_db()
    assert rank1.status == MemberStatus.EXITED and rank1.reason.endswith("unauthorized")
    w.refresh_from_db()
    assert w.status == S.STARTING  # the control plane's step stops the gang as one (gangs.py)


def test_a_slow_worker_whose_agent_died_before_it_asked_to_die_with_it_ends_at_once():
    """The kernel's parent-death signal is asked for after the fork: had the agent died in between, the child
    would run on, the slow queue's worker of no agent. It checks who its parent is once it has asked, and ends
    when that is no longer the agent (here: a pid that is not its parent)."""
    orphan = subprocess.Popen(["sleep", "30"], preexec_fn=functools.partial(_die_with_parent, os.getpid() + 1))
    assert orphan.wait(timeout=10) == 1
    kept = subprocess.Popen(["sleep", "30"], preexec_fn=functools.partial(_die_with_parent, os.getpid()))
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            kept.wait(timeout=0.5)  # its parent is the agent: it runs
    finally:
        kept.kill()
        kept.wait()
