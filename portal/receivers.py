"""Push each instance status change to its owner's browsers over Channels; list prices become rate cards;
a new password revokes the user's API tokens; a new password, deactivation or leaving a team closes the user's
open terminals (of that team's work)."""

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth.hashers import check_password
from django.db.models.signals import post_delete, post_save, pre_save
from django.dispatch import receiver
from django.utils import timezone

from billing.models import Membership, RateCard
from core import messages
from portal.models import GpuType, Instance
from portal.services.relay import terminals_revoke
from portal.services.tokens import tokens_revoke_all
from scheduler.models import WorkloadKind
from scheduler.signals import workload_changed

RATE_CARD_CARRIED = [
    "spot_floor",
    "spot_ceiling",
    "cpus_per_card",
    "memory_gb_per_card",
    "cpu_core_hour",
    "memory_gb_hour",
    "no_gpu_hour",
    "storage_gb_day",
    "free_storage_gb",
]


@receiver(workload_changed)
def push_instance_status(sender, workload_id, owner_id, kind, to_status, reason, **kwargs):
    if kind != WorkloadKind.INSTANCE:
        return  # jobs have their own page, refreshed by htmx
    if settings.NODE_NAME:  # a GPU host's Redis user may not publish to users' groups (core.redis_acl)
        messages.send(messages.ToScheduler.INSTANCE_STATUS_PUSH, workload_id)
        return
    instance_id = Instance.objects.filter(workload_id=workload_id).values_list("pk", flat=True).first()
    if instance_id is not None:
        instance_status_send(owner_id, instance_id, to_status, reason)


def instance_status_send(owner_id: int, instance_id: int, status: str, reason: str) -> None:
    """An instance's status to its owner's open pages (``portal.sockets.monitor.InstanceEventsConsumer``)."""
    async_to_sync(get_channel_layer().group_send)(
        messages.user_group(owner_id),
        {"type": messages.INSTANCE_STATUS, "instance": instance_id, "status": status, "reason": reason},
    )


@receiver(workload_changed)
def array_follows_its_tasks(sender, workload_id, kind, group_id, **kwargs):
    """A task of an array changed: the control plane looks at the array (its budget, whether it ended).

    This may run in a node agent (which may not read the portal's tables): the look itself is a
    task on the scheduler queue; the signal carries the group, so no transition costs a query here."""
    if kind == WorkloadKind.JOB and group_id is not None:
        messages.send(messages.ToScheduler.ARRAY_SUPERVISE, group_id)


@receiver(post_save, sender=GpuType)
def rate_card_follows_list_price(sender, instance, **kwargs):
    """Editing a GPU type's price in the admin starts a new rate card version from now on.

    Past time keeps the rate it ran at; a future-dated version can be added on
    the rate card itself (billing's admin).
    """
    from billing.prices import rate_card_now

    current = rate_card_now(instance.name)
    if current is not None and current.gpu_model == instance.name and current.card_hour == instance.price_per_hour:
        return
    template = current or RateCard()
    RateCard.objects.create(
        gpu_model=instance.name,
        effective_from=timezone.now(),
        card_hour=instance.price_per_hour,
        currency=instance.currency,
        **{f: getattr(template, f) for f in RATE_CARD_CARRIED},
    )


@receiver(pre_save, sender=settings.AUTH_USER_MODEL)
def password_change_revokes_tokens(sender, instance, update_fields=None, **kwargs):
    """A changed password ends every API token of the user (whoever changed it: the console, admin, a command).

    Django re-hashes an unchanged password when its hasher's settings change; that is
    no change (``_password`` holds the raw password ``set_password`` was given).
    """
    if instance.pk is None or (update_fields is not None and "password" not in update_fields):
        return
    stored = sender.objects.filter(pk=instance.pk).values_list("password", flat=True).first()
    if stored is None or stored == instance.password:
        return
    raw = getattr(instance, "_password", None)
    if raw is not None and check_password(raw, stored):
        return
    tokens_revoke_all(user_id=instance.pk)
    terminals_revoke(user_id=instance.pk, reason="your password changed: sign in again")


@receiver(pre_save, sender=settings.AUTH_USER_MODEL)
def deactivation_closes_terminals(sender, instance, update_fields=None, **kwargs):
    if instance.pk is None or instance.is_active or (update_fields is not None and "is_active" not in update_fields):
        return
    if sender.objects.filter(pk=instance.pk, is_active=True).exists():
        terminals_revoke(user_id=instance.pk, reason="your account was deactivated")


@receiver(post_delete, sender=Membership)
def leaving_a_team_closes_its_terminals(sender, instance, **kwargs):
    """A shell in work the team pays for is the team's to allow (member_remove stops that work, in time)."""
    slug = instance.team.slug
    terminals_revoke(user_id=instance.user_id, team=slug, reason=f"you are no longer a member of team {slug}")
