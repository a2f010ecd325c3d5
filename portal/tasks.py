"""Portal's Celery tasks (scheduler queue): idle auto-stop, housekeeping, job arrays' supervision, node
agents' replies about images."""

from celery import shared_task

from core.messages import ToScheduler
from core.signing import sent_by
from portal.services import arrays, housekeeping, images, work


@shared_task(name=ToScheduler.ARRAY_SUPERVISE, ignore_result=True, time_limit=120, soft_time_limit=90)
def array_supervise(group_id: int):
    """A task of an array changed: its budget, its end, its ended array's stragglers."""
    arrays.array_supervise_group(group_id)


@shared_task(name=ToScheduler.ARRAYS_SUPERVISE, ignore_result=True, time_limit=600, soft_time_limit=540)
def arrays_supervise():
    arrays.arrays_supervise()


@shared_task(name=ToScheduler.IDLE_STOP, ignore_result=True)
def idle_stop():
    housekeeping.idle_stop()


@shared_task(name=ToScheduler.RELEASE_LONG_STOPPED, ignore_result=True)
def release_long_stopped():
    housekeeping.housekeeping()


@shared_task(name=ToScheduler.IMAGE_SAVED, ignore_result=True)
def image_saved(image_id: int, size_bytes: int, error: str):
    """A node agent's reply: the commit of a saved image finished (or failed)."""
    images.image_saved(image_id, size_bytes, error, host=sent_by())


@shared_task(name=ToScheduler.IMAGE_REMOVED, ignore_result=True)
def image_removed(image_id: int, size_bytes: int, error: str):
    images.image_removed(image_id, size_bytes, error, host=sent_by())


@shared_task(name=ToScheduler.IMAGE_DELETE, ignore_result=True, time_limit=120, soft_time_limit=90)
def image_delete(image_id: int):
    """Delete a saved image from the registry (after the user's request committed)."""
    images.image_delete_from_registry(image_id)


@shared_task(name=ToScheduler.OPERATIONS_OVERDUE, ignore_result=True, time_limit=120, soft_time_limit=90)
def operations_overdue():
    """Saves, deletions of images and disk growths past their deadline: failed, saying why."""
    images.images_overdue()
    work.disks_overdue()


@shared_task(name=ToScheduler.DISK_GROWN, ignore_result=True)
def disk_grown(instance_id: int, size_gb: int, error: str):
    work.disk_grown(instance_id, size_gb, error, host=sent_by())


@shared_task(name=ToScheduler.INSTANCE_STATUS_PUSH, ignore_result=True, time_limit=60, soft_time_limit=50)
def instance_status_push(workload_id: int):
    """A host's instance changed status: its owner's pages get the status the control plane's records hold now
    (a host's own Redis user may not publish to users' groups: portal.receivers.push_instance_status)."""
    from portal.models import Instance
    from portal.receivers import instance_status_send

    row = (
        Instance.objects.filter(workload_id=workload_id)
        .values_list("owner_id", "pk", "workload__status", "workload__status_reason")
        .first()
    )
    if row is not None:
        instance_status_send(*row)
