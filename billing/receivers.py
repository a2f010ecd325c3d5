"""Billing follows the scheduler's lifecycle facts: running opens metering, leaving it closes and settles."""

from decimal import Decimal

from django.conf import settings
from django.db.models.signals import post_save
from django.dispatch import receiver

from billing.ledger import user_account, wallet_credit
from billing.metering import meter_close, meter_open
from billing.models import PostingKind
from core.messages import ToScheduler, send_after_commit
from scheduler.models import MeterChange, WorkloadStatus
from scheduler.signals import workload_changed, workload_metering


@receiver(workload_changed)
def meter_on_lifecycle(sender, workload_id, from_status, to_status, reason, at, **kwargs):
    # Segments start and end at the event's own time, so reconciliation from the event
    # history (billing.metering.meter_reconcile) finds exactly the same boundaries.
    if to_status == WorkloadStatus.RUNNING and from_status != WorkloadStatus.RUNNING:
        meter_open(workload_id=workload_id, at=at)
        # Who pays and the rate in force, recorded on the segment by the control plane.
        send_after_commit(ToScheduler.SEGMENT_ASSIGN, workload_id, robust=True)
    elif from_status == WorkloadStatus.RUNNING and to_status != WorkloadStatus.RUNNING:
        meter_close(workload_id=workload_id, reason=f"{to_status}: {reason}", at=at)
        # Settled at each stop, as AutoDL does: by the control plane (the node agent that may
        # have recorded the stop has no right to write the ledger).
        send_after_commit(ToScheduler.SETTLE_USAGE, workload_id, robust=True)


@receiver(workload_metering)
def meter_on_pause_or_resume(sender, workload_id, change, at, **kwargs):
    """A running workload's host lost (pause: closed and settled at its last heartbeat) or back (resume), or its
    cards changed (resize: the segment at the old size closed and settled, one at the new size opened)."""
    if change == MeterChange.RESIZE:
        meter_close(workload_id=workload_id, reason="resized: a member joined or left", at=at)
        meter_open(workload_id=workload_id, at=at)
        send_after_commit(ToScheduler.SETTLE_USAGE, workload_id, robust=True)
        send_after_commit(ToScheduler.SEGMENT_ASSIGN, workload_id, robust=True)
    elif change == MeterChange.PAUSE:
        meter_close(workload_id=workload_id, reason="not charged: its host is unreachable", at=at)
        send_after_commit(ToScheduler.SETTLE_USAGE, workload_id, robust=True)
    elif change == MeterChange.RESUME:
        meter_open(workload_id=workload_id, at=at)
        send_after_commit(ToScheduler.SEGMENT_ASSIGN, workload_id, robust=True)


@receiver(post_save, sender=settings.AUTH_USER_MODEL)
def wallet_for_new_user(sender, instance, created, **kwargs):
    """Every user gets a wallet; ``SIGNUP_CREDIT`` (0 by default) is granted to it as a credit."""
    if not created:
        return
    account = user_account(instance)
    credit = Decimal(settings.SIGNUP_CREDIT)
    if credit > 0:
        wallet_credit(
            account=account,
            amount=credit,
            kind=PostingKind.CREDIT,
            memo="sign-up credit",
            by=None,
            idempotency_key=f"signup-{settings.DEPLOYMENT_ID}-{instance.pk}",
        )
