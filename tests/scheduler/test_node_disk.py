"""Per-host disk: each heartbeat reports the disk under the engine's data root; a full host takes nothing new."""

import os

import pytest

from agent import disks, launcher
from scheduler import tick
from scheduler.models import Node, Workload
from scheduler.selectors import cluster_capacity
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
