"""Start without GPU: a stopped instance runs on its node with no card, little CPU and memory, at the no-GPU price."""

from decimal import Decimal

import pytest

from billing.models import MeterSegment, RateCard
from portal.models import Instance
from scheduler.models import Allocation, Node
from tests.conftest import wait_for, wait_status
from tests.portal.test_instance_api import container, create

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_instance_started_without_gpu_holds_no_card_keeps_its_disk_and_pays_the_no_gpu_price(
    api, catalog, node_worker, settings
):
    settings.NO_GPU_CPU_CORES, settings.NO_GPU_MEMORY_MB = 1, 512
    assert create(api, catalog, gpus="1", cpu_cores=2, memory_gb=1).status_code == 201
    instance = Instance.objects.get()
    wait_status(instance.workload, "running")
    assert container(instance).exec_run(["sh", "-c", "echo mine > /root/autodl-tmp/x"]).exit_code == 0
    assert api.post(f"/api/v1/instances/{instance.pk}/stop/").status_code == 202
    wait_status(instance.workload, "stopped")
    node = Node.objects.get()
    assert (node.allocated_cpu, node.allocated_memory_mb) == (0, 0)

    response = api.post(f"/api/v1/instances/{instance.pk}/start-no-gpu/")
    assert response.status_code == 202, response.data
    workload = wait_status(instance.workload, "running")
    assert workload.no_gpu and not Allocation.objects.filter(workload=workload).exists()
    node.refresh_from_db()
    assert (node.allocated_cpu, node.allocated_memory_mb) == (1, 512)
    assert sum(g.allocated_milli for g in node.gpus.all()) == 0
    c = container(instance)
    env = dict(e.split("=", 1) for e in c.attrs["Config"]["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and env["GPUCLOUD_GPU_SHARE"] == "0"  # the toolkit: as runc
    assert c.attrs["HostConfig"]["NanoCpus"] == 10**9 and c.attrs["HostConfig"]["Memory"] == 512 * 1024**2
    assert c.exec_run(["cat", "/root/autodl-tmp/x"]).output == b"mine\n"
    assert api.get(f"/api/v1/instances/{instance.pk}/").data["no_gpu"] is True

    # Billed at the no-GPU price (60 an hour here, so its one-minute minimum is exactly 1.00), settled at the stop.
    RateCard.objects.update(no_gpu_hour=Decimal("60.00"))
    assert api.post(f"/api/v1/instances/{instance.pk}/stop/").status_code == 202
    wait_status(instance.workload, "stopped")
    node.refresh_from_db()
    assert (node.allocated_cpu, node.allocated_memory_mb) == (0, 0)
    runs = list(MeterSegment.objects.filter(workload=workload).order_by("started_at"))
    assert [s.no_gpu for s in runs] == [False, True]
    line = wait_for(lambda: runs[1].postings.first(), what="the no-GPU run settled")
    assert line.amount == Decimal("1.00") and line.seconds == 60

    # A normal start takes its card again.
    assert api.post(f"/api/v1/instances/{instance.pk}/start/").status_code == 202
    workload = wait_status(instance.workload, "running")
    assert not workload.no_gpu and Allocation.objects.filter(workload=workload).count() == 1
    assert container(instance).exec_run(["cat", "/root/autodl-tmp/x"]).output == b"mine\n"


def test_start_without_gpu_is_refused_when_running_or_when_its_node_is_full(api, catalog, node_worker, settings):
    assert create(api, catalog).status_code == 201
    instance = Instance.objects.get()
    wait_status(instance.workload, "running")
    running = api.post(f"/api/v1/instances/{instance.pk}/start-no-gpu/")
    assert running.status_code == 409 and "running" in running.data["detail"]
    assert api.post(f"/api/v1/instances/{instance.pk}/stop/").status_code == 202
    wait_status(instance.workload, "stopped")
    Node.objects.update(allocated_cpu=Node.objects.get().cpu_cores)  # every core taken
    full = api.post(f"/api/v1/instances/{instance.pk}/start-no-gpu/")
    assert full.status_code == 409 and "not enough CPU or memory" in full.data["detail"]
    instance.workload.refresh_from_db()
    assert instance.workload.status == "stopped" and not instance.workload.no_gpu  # nothing half-done
