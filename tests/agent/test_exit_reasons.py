"""A job's status reason says how its container ended: an ordinary exit is not a crash (real containers)."""

import pytest

from agent import launcher
from agent.actions import agent_launch
from agent.exits import exit_reason
from agent.reconcile import agent_reconcile
from scheduler.models import WorkloadStatus
from scheduler.services.allocation import Share, allocation_create
from tests.conftest import make_node, remove_node_containers, wait_status
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("code", "oom", "said"),
    [
        (7, False, "exited with code 7"),
        (1, False, "exited with code 1"),
        (128, False, "exited with code 128"),
        (137, False, "exited with code 137 (killed: SIGKILL)"),
        (137, True, "exited with code 137 (out of memory)"),
        (139, False, "exited with code 139 (crashed: SIGSEGV)"),
        (134, False, "exited with code 134 (crashed: SIGABRT)"),
        (143, False, "exited with code 143 (killed: SIGTERM)"),
        (255, False, "exited with code 255"),
        (None, False, "exited with code None"),
    ],
)
def test_exit_reason_names_a_signal_only_for_128_plus_n(code, oom, said):
    assert exit_reason(code, oom_killed=oom) == said


@pytest.fixture
def node():
    node = make_node("sim:1xRTX3090")
    yield node
    remove_node_containers(node.name)


# The shell that is killed is a child: signals a container's PID 1 has no handler for are not delivered to it.
@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ("exit 7", "container exited with code 7"),
        ("sh -c 'kill -SEGV $$'; exit $?", "container exited with code 139 (crashed: SIGSEGV)"),
        ("sh -c 'kill -KILL $$'; exit $?", "container exited with code 137 (killed: SIGKILL)"),
    ],
)
def test_a_failed_job_says_how_its_container_ended(user, node, base_image, script, reason):
    job = workload(user, kind="job", image_ref=base_image, command=["sh", "-c", script])
    card = node.gpus.get()
    assert allocation_create(workload=job, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    agent_launch(job.pk)

    wait_status(job, "failed", timeout=30, poke=lambda: agent_reconcile(node.name))
    assert job.status == WorkloadStatus.FAILED
    assert job.status_reason == reason
    assert launcher.container_state(job.container_name) is None  # a finished job's container is removed
