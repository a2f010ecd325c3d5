"""A gang's members' containers go when they end, as a single-node job's do: none is left "Exited (0)" on its host
after the gang succeeded, failed or was cancelled (real containers; two simulated hosts on one engine)."""

import pytest

from agent import gangs, launcher
from agent.actions import agent_launch, agent_stop
from agent.reconcile import agent_reconcile
from scheduler.models import MemberStatus, WorkloadStatus
from scheduler.services import gangs as gang_service
from scheduler.services.allocation import Part, Placement, Share, allocations_create
from scheduler.services.gangs import gang_member_on, gang_members, gang_step
from scheduler.services.workloads import workload_stop
from tests.conftest import make_node, remove_node_containers, wait_for
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db
S = WorkloadStatus
# Rank 1 ends as the case says; rank 0 works on (sleep in a child: a container's PID 1 ignores SIGTERM).
SCRIPT = 'case "$NODE_RANK" in 1) {rank1} ;; esac; sleep {rank0} & wait'


@pytest.fixture
def hosts(monkeypatch, settings):
    settings.INSTANCE_STOP_GRACE_S = settings.PREEMPTION_GRACE_S = 2
    # The test's hosts share one engine, where a member's launch would take the other's container for its own
    # earlier copy (one engine per host in production).
    monkeypatch.setattr(gangs, "old_members_remove", lambda workload, keep: None)
    a, b = make_node("sim:1xRTX3090"), make_node("sim:1xRTX3090")
    yield a, b
    for node in (a, b):
        remove_node_containers(node.name)


def running_gang(user, image, a, b, *, rank1: str, rank0: str):
    command = ["sh", "-c", SCRIPT.format(rank1=rank1, rank0=rank0)]
    job = workload(user, kind="job", gpu_count=2, image_ref=image, cpu=1, memory_mb=256, command=command)
    card, other = a.gpus.get(), b.gpus.get()
    rest = (Part(b.pk, [Share(other.pk, 1000, other.memory_mb)]),)
    assert allocations_create([Placement(job, a.pk, [Share(card.pk, 1000, card.memory_mb)], rest=rest)])
    for node in (a, b):
        agent_launch(job.pk, node.name)
    assert len(launcher.containers_of(job.uid)) == 2
    return job


def settled(job, a, b, status: str) -> None:
    def step():
        for node in (a, b):
            agent_reconcile(node.name)
        gang_step(job.pk)

    wait_for(lambda: job.refresh_from_db() or job.status == status, timeout=30, what=f"the gang {status}", poke=step)


def test_a_gang_that_succeeded_leaves_no_container(user, base_image, hosts):
    a, b = hosts
    job = running_gang(user, base_image, a, b, rank1="exit 0", rank0="1")

    settled(job, a, b, S.SUCCEEDED)

    assert launcher.containers_of(job.uid) == []
    assert {m.status for m in gang_members(job)} == {MemberStatus.EXITED}


def test_a_gang_that_failed_leaves_no_container(user, base_image, hosts, settings):
    settings.GANG_MAX_RESTARTS = 0  # rank 1's failure fails the gang
    a, b = hosts
    job = running_gang(user, base_image, a, b, rank1="echo 'rank 1: out of data' >&2; exit 3", rank0="120")

    settled(job, a, b, S.STOPPING)  # rank 1 exited 3: the gang stops rank 0 ...
    agent_stop(job.pk, a.name)  # ... (the STOP its node is sent)
    assert gang_step(job.pk) == S.FAILED

    job.refresh_from_db()
    # Its last line is in the reason too (the whole of its output is in the job's log: tests/client/test_gang_logs.py).
    said = f"member rank 1 on {b.name}: its container exited with code 3; its last line: rank 1: out of data"
    assert job.status_reason.startswith(f"failed: {said}"), job.status_reason
    assert launcher.containers_of(job.uid) == []


def test_a_cancelled_gang_leaves_no_container(user, base_image, hosts):
    a, b = hosts
    job = running_gang(user, base_image, a, b, rank1="true", rank0="120")
    job.refresh_from_db()

    workload_stop(job, reason="stop requested")
    for node in (a, b):
        agent_stop(job.pk, node.name)
    assert gang_step(job.pk) == S.STOPPED

    assert launcher.containers_of(job.uid) == []


def test_members_stopped_without_their_node_task_go_at_the_next_reconcile(user, base_image, hosts):
    """As the self-fence of a host that lost contact stops them: the row says stopped, the container stays;
    its host's reconcile removes it."""
    a, b = hosts
    job = running_gang(user, base_image, a, b, rank1="true", rank0="120")
    for node in (a, b):
        member = gang_member_on(job, node.name)
        member.workload = job
        launcher.container_stop(member.container_name, grace_s=1)
        assert gang_service.member_stopped(member, exit_code=None, reason="its host lost contact and stopped it")
    assert len(launcher.containers_of(job.uid)) == 2

    for node in (a, b):
        agent_reconcile(node.name)

    assert launcher.containers_of(job.uid) == []
