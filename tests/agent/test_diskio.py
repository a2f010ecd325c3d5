"""Disk I/O of an instance: its weight by share and its caps, as Docker and the kernel get them."""

import pytest

from agent import diskio, disks, launcher
from agent.actions import agent_launch
from scheduler.models import WorkloadStatus
from scheduler.services.allocation import Share, allocation_create
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db
MB = 1024 * 1024


@pytest.fixture
def node(sim_node):
    """Two RTX 3090s (indexes 0, 1) and an A100 of simulated cards; its containers go afterwards."""
    return sim_node


def launched(user, node, image, milli=1000, **fields):
    gpu = node.gpus.get(index=0)
    w = workload(user, gpu_milli=milli, image_ref=image, memory_mb=256, **fields)
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(gpu.pk, milli, gpu.memory_mb * milli // 1000)])
    agent_launch(w.pk)
    w.refresh_from_db()
    assert w.status == WorkloadStatus.RUNNING, w.status_reason
    return launcher.docker_client().containers.get(w.container_name)


def test_the_weight_is_100_per_card_within_dockers_range():
    assert [diskio.weight(c) for c in (0, 0.05, 0.5, 1, 8, 20)] == [10, 10, 50, 100, 800, 1000]


def test_caps_are_per_card_with_at_least_one_cards_worth(settings, monkeypatch):
    settings.INSTANCE_IO_READ_MBPS, settings.INSTANCE_IO_WRITE_IOPS = 50, 200
    settings.INSTANCE_IO_WRITE_MBPS = settings.INSTANCE_IO_READ_IOPS = 0
    monkeypatch.setattr(diskio, "weight_supported", lambda: True)
    assert diskio.io_options(0.5, ["/dev/vda"]) == {
        "blkio_weight": 50,
        "device_read_bps": [{"Path": "/dev/vda", "Rate": 50 * MB}],
        "device_write_iops": [{"Path": "/dev/vda", "Rate": 200}],
    }
    assert diskio.io_options(2, ["/dev/vda", "/dev/vdb"])["device_read_bps"][1] == {
        "Path": "/dev/vdb",
        "Rate": 100 * MB,
    }
    monkeypatch.setattr(diskio, "weight_supported", lambda: False)
    assert "blkio_weight" not in diskio.io_options(0.5, ["/dev/vda"])


def test_the_capped_disks_are_those_under_dockers_data_root(settings):
    root = launcher.docker_root()
    disk = diskio.disk_of(root)
    assert disk and disk.startswith("/dev/")
    assert diskio.devices(root)[0] == disk
    assert diskio.disk_of("/proc") is None  # no device of its own
    settings.INSTANCE_IO_DEVICES = ["/dev/sdz"]
    assert diskio.devices(root) == ["/dev/sdz"]


def test_an_instances_caps_reach_its_cgroup(settings, user, node, base_image):
    settings.INSTANCE_IO_WRITE_MBPS, settings.INSTANCE_IO_READ_MBPS = 4, 20
    container = launched(user, node, base_image, milli=500)
    disk = diskio.devices(launcher.docker_root())[0]
    host = container.attrs["HostConfig"]
    assert host["BlkioDeviceWriteBps"] == [{"Path": disk, "Rate": 4 * MB}]
    assert host["BlkioDeviceReadBps"] == [{"Path": disk, "Rate": 20 * MB}]
    throttle = container.exec_run(["cat", "/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device"]).output.decode()
    assert throttle.split()[-1] == str(4 * MB)


def test_the_system_disk_is_sized_only_where_the_storage_driver_takes_a_size(settings):
    settings.INSTANCE_SYSTEM_DISK_GB = 30
    assert disks.system_disk_options("btrfs") == {"storage_opt": {"size": "30G"}}
    assert disks.system_disk_options("overlay2") == {}
    # btrfs's limit counts the image the container's layer is a snapshot of: its size (MiB, rounded up) is added.
    assert disks.system_disk_options("btrfs", 1_150_000_000) == {"storage_opt": {"size": f"{30 * 1024 + 1097}M"}}
    assert disks.system_disk_options("zfs", 1_150_000_000) == {"storage_opt": {"size": "30G"}}
    settings.INSTANCE_SYSTEM_DISK_GB = 0
    assert disks.system_disk_options("btrfs") == {}
