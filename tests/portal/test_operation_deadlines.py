"""Saving an image, deleting one and growing a disk wait on a node's answer, but not forever.

Each has a deadline longer than its node task may run: an operation that got no answer by
then (its message lost, its agent killed, its task stopped at its time limit) has failed,
saying so, instead of holding the instance or the image in "saving", "deleting" or
"growing" for good.
"""

from datetime import timedelta

import pytest

from core.errors import Conflict
from portal.models import Image, ImageStatus, Instance
from portal.services import images, work
from scheduler.models import WorkloadEvent, WorkloadStatus
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


def stopped_instance(user, catalog, node=None) -> Instance:
    """A stopped instance whose disk is on a node (no Docker: only the node's answers matter here)."""
    w = workload(user, status=WorkloadStatus.STOPPED, node=node or make_node("sim:1xRTX3090"))
    return Instance.objects.create(
        owner=user,
        name="i",
        image=catalog["image"],
        gpu_type=catalog["rtx3090"],
        gpus=1,
        cpu_cores=1,
        memory_gb=1,
        disk_gb=10,
        workload=w,
    )


@pytest.fixture
def stopped(user, catalog):
    return stopped_instance(user, catalog)


def aged(model, pk, field: str, seconds: int) -> None:
    """Move the start of an operation ``seconds`` into the past."""
    from core.clock import db_now

    model.objects.filter(pk=pk).update(**{field: db_now() - timedelta(seconds=seconds)})


def test_a_save_with_no_answer_by_its_deadline_fails_saying_so(stopped, settings):
    image = images.image_save(instance=stopped, name="env")
    aged(Image, image.pk, "status_changed_at", settings.IMAGE_SAVE_DEADLINE_S - 5)
    assert images.images_overdue() == []  # still within its deadline: left to its node

    aged(Image, image.pk, "status_changed_at", settings.IMAGE_SAVE_DEADLINE_S + 1)
    assert images.images_overdue() == [image.pk]

    image.refresh_from_db()
    assert image.status == ImageStatus.FAILED
    assert image.status_reason == f"saving failed: its node did not finish within {settings.IMAGE_SAVE_DEADLINE_S} s"
    assert not images.image_busy(stopped)  # the instance may start again
    images.image_saved(image.pk, 123, "")  # an answer after the deadline changes nothing
    image.refresh_from_db()
    assert image.status == ImageStatus.FAILED


def test_a_deletion_with_no_answer_by_its_deadline_leaves_the_image_ready_saying_so(stopped, settings):
    image = images.image_save(instance=stopped, name="env")
    images.image_saved(image.pk, 123, "")
    images.image_delete(image=Image.objects.get(pk=image.pk))
    assert Image.objects.get(pk=image.pk).status == ImageStatus.DELETING
    assert images.images_overdue() == []

    aged(Image, image.pk, "status_changed_at", settings.IMAGE_DELETE_DEADLINE_S + 1)
    assert images.images_overdue() == [image.pk]

    image.refresh_from_db()
    assert image.status == ImageStatus.READY and "no answer within" in image.status_reason
    images.image_delete(image=image)  # and it can be deleted again
    assert Image.objects.get(pk=image.pk).status == ImageStatus.DELETING


def test_a_disk_growth_with_no_answer_by_its_deadline_fails_and_keeps_the_size(stopped, settings):
    work.instance_grow_disk(instance=stopped, disk_gb=20)
    assert work.disks_overdue() == []

    aged(Instance, stopped.pk, "disk_growing_since", settings.DISK_GROW_DEADLINE_S + 1)
    assert work.disks_overdue() == [stopped.pk]

    stopped.refresh_from_db()
    assert stopped.disk_growing_to is None and stopped.disk_gb == 10
    reason = WorkloadEvent.objects.filter(workload=stopped.workload).latest("id").reason
    deadline = settings.DISK_GROW_DEADLINE_S
    assert reason == f"growing the data disk to 20 GB failed: its node did not answer within {deadline} s"
    work.instance_grow_disk(instance=stopped, disk_gb=20)  # may be asked again
    assert Instance.objects.get(pk=stopped.pk).disk_growing_to == 20


def test_a_disk_grows_only_as_far_as_its_host_has_room_counting_growths_under_way(user, catalog, settings):
    settings.INSTANCE_SYSTEM_DISK_GB = 0
    node = make_node("sim:2xRTX3090", disk_gb=50)
    one, two = stopped_instance(user, catalog, node), stopped_instance(user, catalog, node)  # 10 GB each
    work.instance_grow_disk(instance=one, disk_gb=30)  # 20 more: 10 GB left

    with pytest.raises(Conflict, match=f"its host {node.name} has 10 GB left for tenants' disks: it cannot grow by 11"):
        work.instance_grow_disk(instance=two, disk_gb=21)
    two.refresh_from_db()
    assert two.disk_growing_to is None
    work.instance_grow_disk(instance=two, disk_gb=20)
