"""Push each instance status change to its owner's browsers over Channels."""

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.dispatch import receiver

from portal.models import Instance
from scheduler.models import WorkloadKind
from scheduler.signals import workload_changed


def user_group(user_id: int) -> str:
    return f"user-{user_id}"


@receiver(workload_changed)
def push_instance_status(sender, workload_id, owner_id, kind, to_status, reason, **kwargs):
    if kind != WorkloadKind.INSTANCE:
        return  # jobs have their own page, refreshed by htmx
    instance_id = Instance.objects.filter(workload_id=workload_id).values_list("pk", flat=True).first()
    if instance_id is None:
        return
    async_to_sync(get_channel_layer().group_send)(
        user_group(owner_id),
        {"type": "instance.status", "instance": instance_id, "status": to_status, "reason": reason},
    )
