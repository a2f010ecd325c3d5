"""Disks on real hosts: each host's engine keeps its data on btrfs, so an instance's system disk (its writable
layer) has a size, and each host reports its disk to the control plane."""

import pytest

pytestmark = pytest.mark.cluster


def test_an_instances_system_disk_stops_at_its_size_and_its_data_disk_does_not_count(cluster):
    instance = cluster.create_instance("RTX3090", gpus="0.5")
    try:
        running = cluster.wait_instance(instance["id"], "running")
        host = int(running["node"][1:])
        engine = cluster.engine(host)
        assert engine.info()["Driver"] == "btrfs"
        container = engine.containers.get(running["container_id"])
        # 1 GB of its own on top of the image it is a snapshot of (btrfs's quota counts both).
        image_mib = -(-engine.images.get(container.image.id).attrs["Size"] // 2**20)
        assert container.attrs["HostConfig"]["StorageOpt"] == {"size": f"{1024 + image_mib}M"}
        full = container.exec_run(["sh", "-c", "dd if=/dev/zero of=/root/big bs=1M count=1200 2>&1; ls -l /root/big"])
        said = full.output.decode()
        assert "Disk quota exceeded" in said, said
        written = int(said.split()[-5])  # ls -l: the size column
        assert 900 * 2**20 < written <= 2**30
        # The data disk is a volume, not the writable layer: it still takes what the system disk refuses.
        data = container.exec_run(["sh", "-c", "dd if=/dev/zero of=/root/autodl-tmp/f bs=1M count=50 && rm /root/big"])
        assert data.exit_code == 0, data.output.decode()
    finally:
        cluster.release(instance["id"])


def test_each_host_reports_its_disk_at_its_heartbeats(cluster):
    rows = dict(cluster.sql("SELECT name, disk_total_gb FROM scheduler_node WHERE name IN ('h1', 'h2', 'h3')"))
    assert set(rows) == {"h1", "h2", "h3"}
    assert all(total is not None and 60 <= total <= 64 for total in rows.values()), rows
