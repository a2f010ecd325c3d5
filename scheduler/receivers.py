"""The scheduler's own reactions: capacity freed -> tick again; a new user -> its shared storage directory."""

from django.conf import settings
from django.db.models.signals import post_save
from django.dispatch import receiver

from core.messages import ToScheduler, send_after_commit
from scheduler import sharedfs
from scheduler.services.lifecycle import HOLDING
from scheduler.signals import workload_changed


@receiver(workload_changed)
def tick_when_capacity_frees(sender, from_status, to_status, **kwargs):
    if from_status in HOLDING and to_status not in HOLDING:
        from scheduler.services.workloads import tick_soon

        tick_soon()


@receiver(post_save, sender=settings.AUTH_USER_MODEL)
def shared_storage_for_new_user(sender, instance, created, **kwargs):
    """Made early, so every host's JuiceFS client knows the quota before the user's first launch.

    A launch makes it too if this message was lost (``agent.sharedfs.user_dir_ready``).
    """
    if created and sharedfs.enabled():
        send_after_commit(ToScheduler.SHARED_STORAGE_USER, instance.pk, robust=True)
