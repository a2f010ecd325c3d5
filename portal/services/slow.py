"""Slow operations a user starts on their instances and images: how many may be under way at once.

Saving an image, deleting one, growing a disk and moving an instance take minutes to hours on a
node's slow queue, whose worker processes every tenant shares; a restart holds one of the node
agent's threads for up to its stop grace. A user may have at most ``MAX_SLOW_OPERATIONS_PER_USER``
of them under way at once; one more is refused (429) saying so.
"""

from django.conf import settings
from django.contrib.auth import get_user_model

from core.errors import TooMany
from portal.models import Image, ImageStatus, Instance
from scheduler.models import Move, MoveStatus, Workload, WorkloadStatus


def slow_operations_under_way(user) -> int:
    """The user's images being saved or deleted, disks growing, instances moving or restarting."""
    images = Image.objects.filter(owner=user, status__in=[ImageStatus.SAVING, ImageStatus.DELETING]).count()
    disks = Instance.objects.filter(owner=user, disk_growing_to__isnull=False).count()
    moves = Move.objects.filter(workload__owner=user, status=MoveStatus.COPYING).count()
    restarts = Workload.objects.filter(owner=user, status=WorkloadStatus.RUNNING, restarting=True).count()
    return images + disks + moves + restarts


def slow_operations_lock(user) -> None:
    """Take the user's row lock, which serialises the starts of their slow operations (call it first in
    the transaction, before other row locks, as ``workload_submit`` does)."""
    get_user_model().objects.select_for_update().filter(pk=user.pk).exists()


def slow_operation_admit(user) -> None:
    """Refuse one more slow operation of ``user`` beyond the limit. Call inside the transaction that
    starts it: the user's row lock makes two concurrent requests count one after the other."""
    slow_operations_lock(user)
    under_way, limit = slow_operations_under_way(user), settings.MAX_SLOW_OPERATIONS_PER_USER
    if under_way >= limit:
        raise TooMany(
            f"you already have {under_way} slow operations under way (saving or deleting images, growing "
            f"disks, moving or restarting instances; the limit is {limit}): wait until one of them is done, "
            "then try again"
        )
