"""Per-host disk: each heartbeat reports the disk under the engine's data root; a full host takes nothing new."""

import os

import pytest

from agent import disks, launcher
from scheduler import tick
from scheduler.models import Allocation, Move, Node, Workload, WorkloadMember, WorkloadStatus
from scheduler.selectors import cluster_capacity, disk_held
from scheduler.services.allocation import Share, allocation_create
from scheduler.services.nodes import node_heartbeat
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


def test_a_heartbeat_records_the_hosts_disk_and_an_unreadable_one_keeps_the_last(settings):
    node = make_node("sim:1xRTX3090")
    node_heartbeat(name=node.name, epoch=node.epoch, disk=(100, 37))
    node.refresh_from_db()
    assert (node.disk_total_gb, node.disk_free_gb) == (100, 37)
    node_heartbeat(name=node.name, epoch=node.epoch, disk=None)
    node.refresh_from_db()
    assert (node.disk_total_gb, node.disk_free_gb) == (100, 37)


def test_the_agent_measures_the_filesystem_under_the_engines_data_root():
    total, free = disks.host_disk_gb(launcher.docker_root)
    stat = os.statvfs(launcher.docker_root())
    assert total == stat.f_blocks * stat.f_frsize // 1024**3 and 0 <= free <= total

    def engine_down():
        raise ConnectionError("no engine")

    assert disks.host_disk_gb(engine_down) is None


def test_a_host_with_a_full_disk_takes_no_new_work(user, settings):
    settings.NODE_DISK_MIN_FREE_GB = 20
    full, roomy = make_node("sim:2xRTX3090"), make_node("sim:2xRTX3090")
    Node.objects.filter(pk=full.pk).update(disk_total_gb=500, disk_free_gb=19)
    Node.objects.filter(pk=roomy.pk).update(disk_total_gb=500, disk_free_gb=20)
    unmeasured = make_node("sim:2xRTX3090")  # no report yet: not held back
    assert {spec.id for spec in cluster_capacity()} >= {roomy.pk, unmeasured.pk}
    assert full.pk not in {spec.id for spec in cluster_capacity()}

    Node.objects.filter(pk=unmeasured.pk).update(disk_free_gb=0)
    works = [workload(user, name=f"w{i}") for i in range(3)]
    tick.schedule_tick()
    placed = Workload.objects.filter(pk__in=[w.pk for w in works], node__isnull=False)
    assert set(placed.values_list("node_id", flat=True)) == {roomy.pk}
    assert placed.count() == 2  # the roomy host's two cards; the third waits


# --- what a host offers its tenants' disks, counted at placement ---


def test_placement_never_reserves_more_disk_than_a_host_offers_and_a_stopped_instance_keeps_its_share(user, settings):
    """Two instances of 100 GB data disks (130 GB with the system disk) on a host offering 200 GB: the second
    waits saying the disk is short, also while the first is stopped (its disks stay there), until it is gone."""
    settings.INSTANCE_SYSTEM_DISK_GB = 30
    node = make_node("sim:2xRTX3090", disk_gb=200)
    first = workload(user, name="first", disk_gb=100)
    tick.schedule_tick()
    first.refresh_from_db()
    assert first.node_id == node.pk
    second = workload(user, name="second", disk_gb=100)

    tick.schedule_tick()
    second.refresh_from_db()
    assert second.status == WorkloadStatus.QUEUED
    assert "too little free disk for its disks (130 GB)" in second.status_reason
    assert cluster_capacity()[0].disk_free_gb == 70

    Workload.objects.filter(pk=first.pk).update(status=WorkloadStatus.STOPPED)  # its disks stay on the host
    Allocation.objects.filter(workload=first).delete()
    tick.schedule_tick()
    second.refresh_from_db()
    assert second.node_id is None and "too little free disk" in second.status_reason

    Workload.objects.filter(pk=first.pk).update(status=WorkloadStatus.RELEASED)
    tick.schedule_tick()
    second.refresh_from_db()
    assert second.node_id == node.pk and second.status == WorkloadStatus.STARTING


def test_a_stale_plan_cannot_reserve_disk_the_host_no_longer_has(user, settings):
    """The allocation service re-checks the disk under the node's lock: what another placement took in between
    is counted, whatever the policy planned."""
    settings.INSTANCE_SYSTEM_DISK_GB = 30
    node = make_node("sim:2xRTX3090", disk_gb=200)
    cards = list(node.gpus.all())
    taken = workload(user, name="taken", disk_gb=100, status=WorkloadStatus.STOPPED, node=node)
    late = workload(user, name="late", disk_gb=100)
    share = Share(cards[0].pk, 1000, cards[0].memory_mb)
    assert not allocation_create(workload=late, node_id=node.pk, shares=[share])
    Workload.objects.filter(pk=taken.pk).update(status=WorkloadStatus.RELEASED)
    assert allocation_create(workload=late, node_id=node.pk, shares=[share])


def test_work_returning_to_its_host_counts_its_disks_there_once(user, settings):
    """A stopped instance started again returns to the host holding its disks: they are counted there while it
    waits, and not a second time when it is placed."""
    settings.INSTANCE_SYSTEM_DISK_GB = 30
    node = make_node("sim:2xRTX3090", disk_gb=140)
    back = workload(user, name="back", disk_gb=100, node=node, pinned_node=node)
    assert disk_held([node.pk]) == {node.pk: 130}
    tick.schedule_tick()
    back.refresh_from_db()
    assert back.status == WorkloadStatus.STARTING and back.node_id == node.pk
    assert disk_held([node.pk]) == {node.pk: 130}
    newcomer = workload(user, name="newcomer", disk_gb=1)  # 31 GB: 10 are left
    tick.schedule_tick()
    newcomer.refresh_from_db()
    assert newcomer.node_id is None


def test_a_gangs_members_and_a_moves_copy_hold_disk_on_their_hosts(user, settings):
    settings.INSTANCE_SYSTEM_DISK_GB = 0
    rank0, rank1, target = (make_node("sim:1xRTX3090", disk_gb=1000) for _ in range(3))
    gang = workload(user, name="gang", gpu_count=2, nodes=2, disk_gb=50, status=WorkloadStatus.RUNNING, node=rank0)
    WorkloadMember.objects.create(workload=gang, rank=0, node=rank0, node_name=rank0.name)
    WorkloadMember.objects.create(workload=gang, rank=1, node=rank1, node_name=rank1.name)
    moving = workload(user, name="moving", disk_gb=70, status=WorkloadStatus.MOVING, node=rank1)
    Move.objects.create(workload=moving, source=rank1, target=target)
    assert disk_held([rank0.pk, rank1.pk, target.pk]) == {rank0.pk: 50, rank1.pk: 120, target.pk: 70}


def test_a_host_registers_what_it_offers_for_tenants_disks(settings):
    """Its data root's size less the free space kept back, NODE_DISK_GB never above that; a demo host with
    simulated cards that oversubscribes the machine offers SIM_DISK_GB_PER_CARD a card."""
    from agent.actions import agent_register

    total, _ = disks.host_disk_gb(launcher.docker_root)
    settings.GPU_BACKEND, settings.NODE_OVERCOMMIT_SIMULATED, settings.NODE_DISK_MIN_FREE_GB = "sim:2xT4", False, 20
    assert agent_register("test-disk-offered").disk_gb == total - 20
    settings.NODE_DISK_GB = 10
    assert agent_register("test-disk-offered").disk_gb == 10
    settings.NODE_DISK_GB = total + 1000
    assert agent_register("test-disk-offered").disk_gb == total - 20
    settings.NODE_DISK_GB, settings.NODE_OVERCOMMIT_SIMULATED = 0, True
    assert agent_register("test-disk-offered").disk_gb == 2 * settings.SIM_DISK_GB_PER_CARD


def test_an_ended_job_holds_its_data_disk_and_no_system_disk_until_released(user, settings):
    settings.INSTANCE_SYSTEM_DISK_GB = 30
    node = make_node("sim:1xRTX3090", disk_gb=1000)
    job = workload(user, kind="job", disk_gb=50, status=WorkloadStatus.RUNNING, node=node)
    stopped = workload(user, kind="instance", disk_gb=20, status=WorkloadStatus.STOPPED, node=node)
    assert disk_held([node.pk]) == {node.pk: 80 + 50}
    Workload.objects.filter(pk=job.pk).update(status=WorkloadStatus.SUCCEEDED)  # its container is gone
    assert disk_held([node.pk]) == {node.pk: 50 + 50}
    Workload.objects.filter(pk__in=[job.pk, stopped.pk]).update(status=WorkloadStatus.RELEASED)
    assert disk_held([node.pk]) == {node.pk: 0}


def test_the_cluster_page_shows_each_hosts_disk_reserved_of_what_it_offers(user, django_user_model, settings):
    from django.test import Client

    settings.INSTANCE_SYSTEM_DISK_GB = 30
    node = make_node("sim:1xRTX3090", disk_gb=200)
    uncounted = make_node("sim:1xRTX3090")
    workload(user, disk_gb=100, status=WorkloadStatus.STOPPED, node=node)
    staff = Client()
    staff.force_login(django_user_model.objects.create_superuser("root-disk", password="x"))
    page = staff.get("/cluster/").content.decode()
    assert "130/200 GB disk" in page
    section = page[page.index(f'data-node="{uncounted.name}"') :]
    assert " GB disk" not in section[: section.index("</h2>")]  # not counted: nothing to show


def _held_by_rows(node_ids) -> dict:
    """(data disks' GB, containers) of the workloads on each node, from the rows one by one: the rule as
    ``selectors.disk_held`` states it, apart from both the SQL sum and the trigger-kept deltas."""
    held = {pk: (0, 0) for pk in node_ids}
    for w in Workload.objects.all():
        if w.status == WorkloadStatus.RELEASED:
            continue
        home = w.pinned_node_id if w.status == WorkloadStatus.QUEUED else (w.node_id or w.pinned_node_id)
        if home in held:
            ended = w.kind == "job" and w.status in WorkloadStatus.ended_job()
            gb, containers = held[home]
            held[home] = (gb + w.disk_gb, containers + (0 if ended else 1))
    return held


def _held(read, node_ids) -> dict:
    """What ``read`` (``selectors._disk_deltas`` or ``_disk_summed``) gives for each node, nothing as (0, 0)."""
    held = {pk: (0, 0) for pk in node_ids}
    for node_id, gb, containers in read(node_ids):
        if node_id in held:
            held[node_id] = (gb, containers)
    return held


def _agree(node_ids) -> dict:
    from scheduler.selectors import _disk_deltas, _disk_summed

    rows = _held_by_rows(node_ids)
    assert _held(_disk_deltas, node_ids) == _held(_disk_summed, node_ids) == rows
    return rows


def test_the_workloads_disks_kept_per_node_follow_every_change_of_the_rows(user, settings):
    """On PostgreSQL what the workloads' disks hold is kept per node by a trigger (``DiskDelta``), not summed from
    every row each tick: a placement, a start, an end, a release, a requeue, a move of node or of the node to
    return to, a disk grown, a delete, a model save and a bulk update each change it as a sum of the rows would."""
    settings.INSTANCE_SYSTEM_DISK_GB = 30
    a, b = make_node("sim:1xRTX3090", disk_gb=10_000), make_node("sim:1xRTX3090", disk_gb=10_000)
    nodes = [a.pk, b.pk]
    jobs = [workload(user, kind="job", name=f"j{i}", disk_gb=10 * (i + 1), no_gpu=True) for i in range(4)]
    box = workload(user, name="box", disk_gb=50, pinned_node=b)  # queued: counted where it must return
    assert _agree(nodes) == {a.pk: (0, 0), b.pk: (50, 1)}
    for job in jobs:
        assert allocation_create(workload=job, node_id=a.pk, shares=[])  # queued -> starting on a
    Workload.objects.filter(pk__in=[j.pk for j in jobs]).update(status=WorkloadStatus.RUNNING)
    assert _agree(nodes) == {a.pk: (100, 4), b.pk: (50, 1)}
    ended = [WorkloadStatus.SUCCEEDED, WorkloadStatus.FAILED, WorkloadStatus.STOPPED]
    for job, status in zip(jobs, ended, strict=False):
        job.refresh_from_db()
        job.status = status
        job.save()  # every column written, as a model save does: the container goes, the data disk stays
    assert _agree(nodes) == {a.pk: (100, 1), b.pk: (50, 1)}
    assert disk_held(nodes) == {a.pk: 100 + 30, b.pk: 50 + 30}
    Workload.objects.filter(pk=jobs[0].pk).update(node=None, pinned_node=b)  # counted where it must return
    Workload.objects.filter(pk=jobs[1].pk).update(disk_gb=25)  # grown while ended
    Workload.objects.filter(pk=jobs[2].pk).update(status=WorkloadStatus.RELEASED)
    Workload.objects.filter(pk=jobs[3].pk).update(disk_gb=45)  # grown while it runs
    assert _agree(nodes) == {a.pk: (70, 1), b.pk: (60, 1)}
    Workload.objects.filter(pk=jobs[0].pk).update(pinned_node=a)  # only the node it returns to changes
    Workload.objects.filter(pk=box.pk).update(status=WorkloadStatus.RUNNING, node=a)  # placed away from b
    assert _agree(nodes) == {a.pk: (130, 2), b.pk: (0, 0)}
    Workload.objects.filter(pk__in=[jobs[0].pk, jobs[1].pk]).update(status=WorkloadStatus.QUEUED)  # requeued
    assert _agree(nodes) == {a.pk: (105, 3), b.pk: (0, 0)}  # jobs[0] returns to a: counted there, as live
    Workload.objects.filter(pk__in=[jobs[0].pk, jobs[1].pk, jobs[3].pk]).update(status=WorkloadStatus.FAILED, node=b)
    Workload.objects.filter(pk=jobs[3].pk).delete()
    Workload.objects.filter(pk=box.pk).update(kind="job")  # a change of kind alone: a running job still has one
    assert _agree(nodes) == {a.pk: (50, 1), b.pk: (35, 0)}
    assert disk_held(nodes) == {a.pk: 50 + 30, b.pk: 35}


def test_folding_the_disk_deltas_keeps_their_sums(user, settings):
    from scheduler.models import DiskDelta
    from scheduler.services.cluster import disk_delta_fold

    nodes = [make_node("sim:1xRTX3090", disk_gb=10_000).pk for _ in range(3)]
    for i in range(30):
        job = workload(user, kind="job", name=f"j{i}", disk_gb=i + 1, status="running", node_id=nodes[i % 3])
        Workload.objects.filter(pk=job.pk).update(status=WorkloadStatus.SUCCEEDED)
        if i % 2:
            Workload.objects.filter(pk=job.pk).update(status=WorkloadStatus.RELEASED)
    before = _agree(nodes)
    assert DiskDelta.objects.count() == 30 + 30 + 15  # each start, end and release
    assert disk_delta_fold(slack=100) == 0  # few rows yet: left as they are
    assert disk_delta_fold(slack=0) == 75
    assert DiskDelta.objects.count() == 3 and _agree(nodes) == before
