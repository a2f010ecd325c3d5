"""The node agent against the real Docker engine: what it promises and what it refuses."""

import contextlib
import os
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agent import gangs, launcher
from agent.actions import agent_launch, agent_register, agent_stop
from agent.reconcile import agent_reconcile
from billing.metering import meter_reconcile
from billing.models import MeterSegment
from core.clock import db_now
from scheduler.models import ClusterWatch, MemberStatus, Node, Workload, WorkloadStatus
from scheduler.services import lifecycle
from scheduler.services.allocation import Part, Placement, Share, allocation_create, allocations_create
from scheduler.services.gangs import gang_member_on, gang_members, gang_step, gangs_of_lost_node
from scheduler.services.node_loss import nodes_mark_lost
from scheduler.services.workloads import workload_stop
from tests.conftest import make_node, remove_node_containers
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


def test_a_node_never_advertises_more_cpus_or_memory_than_its_host_has(settings):
    settings.GPU_BACKEND = "sim:1xT4"
    settings.NODE_CPUS = 100 * (os.cpu_count() or 1)
    settings.NODE_MEMORY_MB = 1 << 30
    node = agent_register("test-oversold")
    assert node.cpu_cores == os.cpu_count()
    assert node.memory_mb == launcher.docker_client().info()["MemTotal"] // (1024 * 1024)


def test_simulated_hosts_sharing_a_machine_may_advertise_more_than_it_has_when_told_so(settings):
    settings.GPU_BACKEND = "sim:1xT4"
    settings.NODE_CPUS = 100 * (os.cpu_count() or 1)
    settings.NODE_MEMORY_MB = 1 << 30
    settings.NODE_OVERCOMMIT_SIMULATED = True
    node = agent_register("test-shared-machine")
    assert (node.cpu_cores, node.memory_mb) == (settings.NODE_CPUS, settings.NODE_MEMORY_MB)
    settings.NODE_CPUS = settings.NODE_MEMORY_MB = 0
    node = agent_register("test-shared-machine")
    # Unset, it offers what its one simulated card comes with (make run's demo on a 2-core machine).
    assert node.cpu_cores == max(os.cpu_count(), settings.SIM_CPUS_PER_CARD)
    assert node.memory_mb == launcher.docker_client().info()["MemTotal"] // (1024 * 1024)
    settings.NODE_OVERCOMMIT_SIMULATED = False
    assert agent_register("test-shared-machine").cpu_cores == os.cpu_count()


def test_work_asking_more_cores_than_the_host_has_fails_to_start_instead_of_being_capped(user, base_image):
    node = make_node("sim:1xRTX3090", cpu_cores=1024)
    card = node.gpus.get()
    cores = (os.cpu_count() or 1) + 2
    w = workload(user, cpu=cores, image_ref=base_image)
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    try:
        agent_launch(w.pk)
        w.refresh_from_db()
        assert w.status == WorkloadStatus.FAILED
        assert f"asks for {cores} CPU cores" in w.status_reason
        assert launcher.containers_on_node(node.name) == {}
    finally:
        remove_node_containers(node.name)


def test_on_a_demo_host_that_oversubscribes_the_machine_more_cores_run_capped_at_it(user, base_image, settings):
    settings.NODE_OVERCOMMIT_SIMULATED = True  # make run's simulated node
    node = make_node("sim:1xRTX3090", cpu_cores=1024)
    card = node.gpus.get()
    host = os.cpu_count() or 1
    w = workload(user, cpu=host + 2, image_ref=base_image)
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    try:
        agent_launch(w.pk)
        w.refresh_from_db()
        assert w.status == WorkloadStatus.RUNNING, w.status_reason
        container = launcher.docker_client().containers.get(w.container_name)
        assert container.attrs["HostConfig"]["NanoCpus"] == host * 10**9
    finally:
        remove_node_containers(node.name)


def test_reconciliation_is_per_deployment(user, base_image, settings):
    node = make_node("sim:1xRTX3090")
    # Another deployment's container on the same engine and node name is not ours to remove.
    labels = {
        f"{launcher.LABEL}.node": node.name,
        f"{launcher.LABEL}.deployment": "other-deployment",
        f"{launcher.LABEL}.uid": "0123456789ab",
    }
    other = launcher.docker_client().containers.create(base_image, ["true"], labels=labels, network_mode="none")
    try:
        settings.DEPLOYMENT_ID = "test-this-one"
        agent_reconcile(node.name)
        other.reload()  # raises NotFound if reconciliation removed it
    finally:
        other.remove(force=True)
        remove_node_containers(node.name)


def test_many_disks_the_database_does_not_know_are_kept_a_few_are_removed(settings):
    """Issue 31 §3: an agent pointed at a database restored from a backup (or another deployment's with the same
    DEPLOYMENT_ID) would delete every newer tenant's disk as an orphan. More than ORPHAN_MAX_UNKNOWN unknown ones,
    and more than ORPHAN_MAX_UNKNOWN_PERCENT of the host's: none is removed. A few leftovers still are, once they have
    been unknown for ORPHAN_QUARANTINE_S."""
    node = make_node("sim:1xRTX3090")
    client = launcher.docker_client()

    def disk(uid: str):
        labels = {f"{launcher.LABEL}.node": node.name, f"{launcher.LABEL}.deployment": settings.DEPLOYMENT_ID}
        return client.volumes.create(
            name=f"gpucloud-test-{node.name}-{uid}", labels=labels | {f"{launcher.LABEL}.uid": uid}
        )

    made = [disk(f"{i:012d}") for i in range(5)]
    try:
        agent_reconcile(node.name)
        assert len(launcher.volumes_on_node(node.name)) == 5, "a database that does not know them: kept"
        settings.ORPHAN_MAX_UNKNOWN = 5  # five is few enough here
        agent_reconcile(node.name)
        assert len(launcher.volumes_on_node(node.name)) == 5, "a few leftovers: quarantined, not removed yet"
        settings.ORPHAN_QUARANTINE_S = 0  # ... until they have been unknown that long
        agent_reconcile(node.name)
        assert launcher.volumes_on_node(node.name) == {}, "a few leftovers: removed"
    finally:
        for volume in made:
            with contextlib.suppress(Exception):
                volume.remove(force=True)


def test_a_container_the_database_does_not_know_is_stopped_and_kept_until_its_quarantine_ends(
    user, base_image, settings
):
    node = make_node("sim:1xRTX3090")
    try:
        w = running_instance(user, node, base_image)
        Workload.objects.filter(pk=w.pk).delete()  # as a database restored from a backup older than it
        agent_reconcile(node.name)
        state = launcher.container_state(w.container_name)
        assert state is not None and not state.running  # stopped, its disk and container kept
        assert w.volume_name in launcher.volumes_on_node(node.name).values()

        settings.ORPHAN_QUARANTINE_S = 0
        agent_reconcile(node.name)
        assert launcher.container_state(w.container_name) is None
        assert w.volume_name not in launcher.volumes_on_node(node.name).values()
    finally:
        remove_node_containers(node.name)


def test_the_quarantine_counts_from_when_a_uid_was_first_seen_unknown_across_restarts(settings, tmp_path):
    from agent.quarantine import Quarantine

    settings.ORPHAN_QUARANTINE_S = 100
    assert Quarantine("n", tmp_path).hold({"a", "b"}, now=1000) == set()
    restarted = Quarantine("n", tmp_path)  # a new agent: the same file
    assert restarted.hold({"a", "b"}, now=1050) == set()
    assert restarted.hold({"a"}, now=1100) == {"a"}  # b is known again: out of the quarantine
    assert restarted.hold({"a", "b"}, now=1150) == {"a"}  # b's clock starts again


def running_instance(user, node, image, **fields):
    """Work launched by the agent on a free card of ``node`` (an instance unless ``kind`` says otherwise)."""
    w = workload(user, image_ref=image, cpu=1, **fields)
    card = node.gpus.filter(allocated_milli=0).first()
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    agent_launch(w.pk)
    w.refresh_from_db()
    assert w.status == WorkloadStatus.RUNNING, w.status_reason
    return w


def is_running(w) -> bool:
    state = launcher.containers_on_node(w.node.name).get(w.uid)
    return state is not None and state.running


def test_a_returning_node_keeps_its_running_instance_and_stops_what_was_stopped_while_it_was_away(user, base_image):
    node = make_node("sim:2xRTX3090")
    try:
        kept = running_instance(user, node, base_image)
        stopped = running_instance(user, node, base_image)
        ClusterWatch.objects.create(pk=1, checked_at=db_now(), watching_since=db_now() - timedelta(hours=1))
        Node.objects.filter(pk=node.pk).update(last_heartbeat=db_now() - timedelta(minutes=5))
        assert nodes_mark_lost(silent_for=timedelta(seconds=30)) == [node.name]
        workload_stop(stopped, reason="stop requested")  # its owner stops it while the node is away
        stopped.refresh_from_db()
        assert stopped.status == WorkloadStatus.STOPPED and is_running(stopped)  # the cut-off host still runs it

        agent_reconcile(node.name)  # the fence the agent runs before it rejoins

        kept.refresh_from_db()
        assert kept.status == WorkloadStatus.RUNNING and is_running(kept)  # re-adopted as it is
        assert not is_running(stopped)
        assert stopped.container_name in {c.name for c in launcher.docker_client().containers.list(all=True)}
        assert stopped.volume_name in launcher.volumes_on_node(node.name).values()  # its disk stays
    finally:
        remove_node_containers(node.name)


def killed_instance(user, node, image):
    """A running instance whose container has just been killed; the agent has not read it yet."""
    w = running_instance(user, node, image)
    launcher.docker_client().containers.get(w.container_name).kill()
    return w


def test_a_container_that_died_while_nobody_looked_is_charged_until_it_died_not_until_it_was_seen(user, base_image):
    node = make_node("sim:1xRTX3090")
    try:
        w = killed_instance(user, node, base_image)
        died = launcher.finished_at_of(launcher.docker_client().api.inspect_container(w.container_name)["State"])
        Node.objects.filter(pk=node.pk).update(last_heartbeat=db_now() - timedelta(minutes=5))  # it proved alive

        agent_reconcile(node.name)

        w.refresh_from_db()
        ended = w.events.get(from_status=WorkloadStatus.RUNNING)
        assert w.status == WorkloadStatus.FAILED and "137" in w.status_reason
        assert ended.created_at.timestamp() == pytest.approx(died, abs=2e-6)  # Docker's FinishedAt, not the read
        meter_reconcile(since=db_now() - timedelta(hours=1))  # the meter, as the events say it ran
        assert MeterSegment.objects.get(workload=w).ended_at == ended.created_at == w.finished_at
    finally:
        remove_node_containers(node.name)


def test_a_host_cannot_end_a_run_before_it_last_proved_alive(user, base_image):
    node = make_node("sim:1xRTX3090")
    try:
        w = killed_instance(user, node, base_image)
        heard = db_now()  # a heartbeat after the container died: the end is no earlier than that
        Node.objects.filter(pk=node.pk).update(last_heartbeat=heard)

        agent_reconcile(node.name)

        assert w.events.get(from_status=WorkloadStatus.RUNNING).created_at == heard
    finally:
        remove_node_containers(node.name)


def test_work_that_started_after_reconciliation_read_docker_is_not_taken_for_gone(user, base_image, monkeypatch):
    node = make_node("sim:1xRTX3090")
    try:
        w = running_instance(user, node, base_image)
        # Docker was read before the launch; the database, after it committed "running".
        monkeypatch.setattr(launcher, "containers_on_node", lambda name: {})

        agent_reconcile(node.name)

        w.refresh_from_db()
        assert w.status == WorkloadStatus.RUNNING, w.status_reason
        monkeypatch.undo()
        assert is_running(w)
    finally:
        remove_node_containers(node.name)


def test_containers_and_volumes_of_work_released_while_the_node_was_away_are_removed(user, base_image):
    node = make_node("sim:1xRTX3090")
    try:
        w = running_instance(user, node, base_image)
        Workload.objects.filter(pk=w.pk).update(status=WorkloadStatus.RELEASED)

        agent_reconcile(node.name)

        assert launcher.containers_on_node(node.name) == {}
        assert launcher.volumes_on_node(node.name) == {}
    finally:
        remove_node_containers(node.name)


@pytest.mark.parametrize("status", [WorkloadStatus.STARTING, WorkloadStatus.STOPPING, WorkloadStatus.RELEASING])
def test_work_whose_task_died_in_a_transitional_state_is_settled_after_its_deadline(user, base_image, status):
    node = make_node("sim:1xRTX3090")
    try:
        w = running_instance(user, node, base_image)
        card = node.gpus.get()
        # The task that should move it on was lost (worker killed): only the row says where it stands.
        Workload.objects.filter(pk=w.pk).update(
            status=status, status_changed_at=timezone.now() - timedelta(seconds=settings.TRANSITION_DEADLINE_S + 1)
        )
        if status == WorkloadStatus.RELEASING:
            w.refresh_from_db()
            lifecycle.allocations_free(w.pk)  # what stop did before the release was asked

        agent_reconcile(node.name)

        w.refresh_from_db()
        card.refresh_from_db()
        expected = {
            WorkloadStatus.STARTING: WorkloadStatus.RUNNING,  # Docker shows it running: it did start
            WorkloadStatus.STOPPING: WorkloadStatus.STOPPED,
            WorkloadStatus.RELEASING: WorkloadStatus.RELEASED,
        }[status]
        assert w.status == expected, w.status_reason
        if status != WorkloadStatus.STARTING:
            assert not is_running(w) and card.allocated_milli == 0
    finally:
        remove_node_containers(node.name)


def test_a_launch_that_never_started_its_container_fails_after_the_deadline_and_frees_its_cards(user, base_image):
    node = make_node("sim:1xRTX3090")
    w = workload(user, image_ref=base_image)
    card = node.gpus.get()
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    Workload.objects.filter(pk=w.pk).update(
        status_changed_at=timezone.now() - timedelta(seconds=settings.TRANSITION_DEADLINE_S + 1)
    )

    agent_reconcile(node.name)

    w.refresh_from_db()
    card.refresh_from_db()
    assert w.status == WorkloadStatus.FAILED and "did not finish" in w.status_reason
    assert card.allocated_milli == 0


def test_work_within_its_deadline_is_left_to_its_task(user, base_image):
    node = make_node("sim:1xRTX3090")
    w = workload(user, image_ref=base_image)
    card = node.gpus.get()
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])

    agent_reconcile(node.name)

    w.refresh_from_db()
    assert w.status == WorkloadStatus.STARTING


def test_single_node_work_launches_and_stops_without_asking_for_gang_members(user, base_image):
    node = make_node("sim:1xRTX3090")
    w = workload(user, image_ref=base_image, cpu=1)
    card = node.gpus.get()
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    try:
        with CaptureQueriesContext(connection) as launch:
            agent_launch(w.pk)
        w.refresh_from_db()
        assert w.status == WorkloadStatus.RUNNING, w.status_reason
        with CaptureQueriesContext(connection) as stop:
            workload_stop(w, reason="stop requested")
            agent_stop(w.pk)
        w.refresh_from_db()
        assert w.status == WorkloadStatus.STOPPED, w.status_reason
    finally:
        remove_node_containers(node.name)
    # Its row says it is no gang (no rendezvous port): the members' table is none of its business.
    for queries in (launch, stop):
        assert not [q["sql"] for q in queries.captured_queries if "scheduler_workloadmember" in q["sql"]]


def test_a_returning_node_removes_the_container_of_a_gang_member_that_moved_elsewhere(user, base_image, monkeypatch):
    a, b, c = (make_node("sim:1xRTX3090") for _ in range(3))
    job = workload(user, kind="job", gpu_count=2, image_ref=base_image, cpu=1, memory_mb=256)

    def place(first, second):
        card, other = first.gpus.get(), second.gpus.get()
        rest = (Part(second.pk, [Share(other.pk, 1000, other.memory_mb)]),)
        assert allocations_create([Placement(job, first.pk, [Share(card.pk, 1000, card.memory_mb)], rest=rest)])

    def names(node) -> set[str]:
        return {state.name for state in launcher.containers_on_node(node.name).values()}

    # The test's hosts share one engine, where a member's launch would take the other's container for its own
    # earlier copy (one engine per host in production).
    monkeypatch.setattr(gangs, "old_members_remove", lambda workload, keep: None)
    try:
        place(a, b)
        for node in (a, b):
            agent_launch(job.pk, node.name)
        assert {m.status for m in gang_members(job)} == {MemberStatus.RUNNING}
        # b is cut off: its agent stops its member, the control plane calls b lost, the gang stops as one...
        rank1 = gang_member_on(job, b.name)
        rank1.workload = job
        launcher.container_stop(rank1.container_name, grace_s=1)
        gangs_of_lost_node(b, why="silent")
        agent_stop(job.pk, a.name)
        assert gang_step(job.pk) == WorkloadStatus.QUEUED
        # ...and is placed again on a (rank 0 again) and c, away from b, whose stopped member stays there.
        place(a, c)
        assert names(b) == {rank1.container_name}

        for node in (a, b):
            agent_reconcile(node.name)  # b's before it rejoins

        assert names(b) == set()  # the member that moved away is gone from the host it left
        assert names(a) == set()  # rank 0's stopped container went with its stop: its next launch starts anew
    finally:
        for node in (a, b, c):
            remove_node_containers(node.name)


def test_a_returning_node_removes_the_container_of_a_single_node_job_requeued_elsewhere(user, base_image):
    lost, other = make_node("sim:1xRTX3090"), make_node("sim:1xRTX3090")
    try:
        job = running_instance(user, lost, base_image, kind="job", memory_mb=256)
        ClusterWatch.objects.create(pk=1, checked_at=db_now(), watching_since=db_now() - timedelta(hours=1))
        Node.objects.filter(pk=lost.pk).update(last_heartbeat=db_now() - timedelta(minutes=5))
        assert nodes_mark_lost(silent_for=timedelta(seconds=30)) == [lost.name]
        job.refresh_from_db()
        assert job.status == WorkloadStatus.QUEUED and job.node is None  # requeued while its host is cut off
        card = other.gpus.get()
        assert allocation_create(workload=job, node_id=other.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
        assert job.uid in launcher.containers_on_node(lost.name)  # the cut-off host still has the old run

        agent_reconcile(lost.name)  # the fence the agent runs before it rejoins

        assert job.uid not in launcher.containers_on_node(lost.name)  # gone from the host it left
    finally:
        for node in (lost, other):
            remove_node_containers(node.name)


@pytest.mark.django_db(transaction=True)
def test_an_agent_starting_while_the_database_is_unreachable_tries_again_then_registers(settings, monkeypatch):
    from django.db import OperationalError

    from agent.management.commands import node_agent

    settings.GPU_BACKEND = "sim:1xT4"
    real_register, attempts, waits = node_agent.agent_register, [], []

    def unreachable_twice(name, **kwargs):
        attempts.append(name)
        if len(attempts) <= 2:
            raise OperationalError("consuming input failed: could not receive data from server: Connection timed out")
        return real_register(name, **kwargs)

    monkeypatch.setattr(node_agent, "agent_register", unreachable_twice)
    try:
        node, _ = node_agent.agent_start("test-db-away", "", wait=waits.append)
        assert (node.name, node.status) == ("test-db-away", "active")
        assert waits == [1.0, 2.0]  # it waited, longer each time, and did not die at the first refusal
    finally:
        remove_node_containers("test-db-away")


@pytest.mark.django_db(transaction=True)
def test_an_agent_whose_database_never_answers_gives_up_after_its_patience_saying_why(settings, monkeypatch):
    from django.core.management.base import CommandError
    from django.db import OperationalError

    from agent.management.commands import node_agent

    settings.GPU_BACKEND = "sim:1xT4"
    settings.NODE_START_PATIENCE_S = 30
    waits = []

    def never(name, **kwargs):
        raise OperationalError("connection timeout expired")

    monkeypatch.setattr(node_agent, "agent_register", never)
    try:
        with pytest.raises(CommandError, match="cannot be reached .*connection timeout expired"):
            node_agent.agent_start("test-db-never", "", wait=waits.append)
        assert waits == [1.0, 2.0, 4.0, 8.0, 15.0]  # doubling up to 15 s, given up once the next wait passes 30 s
    finally:
        remove_node_containers("test-db-never")
