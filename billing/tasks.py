"""Billing's Celery tasks (scheduler queue): metering repair, settlement, spot prices, limits, checks."""

import logging
from datetime import timedelta

from celery import shared_task
from django.utils import timezone

from billing import enforcement, prices, selectors, settlement, storage
from billing.ledger import ledger_check
from billing.metering import meter_reconcile as reconcile
from core.messages import ToScheduler

log = logging.getLogger(__name__)
# Work whose events are older than this is settled: the live receivers and earlier runs covered it.
RECONCILE_WINDOW = timedelta(days=1)
SETTLER_BUSY_RETRY_S = 5  # a settlement that found another running comes back after this, then twice as late
SETTLER_BUSY_RETRY_MAX_S = 60  # ... up to this: a stop's bill at most a minute after the hourly run ends


def busy_retry_in(retries: int) -> int:
    """Seconds until a settlement that found the lock taken ``retries`` times before tries again: 5, 10, 20, 40, then
    every 60 (a hundred stops during a three-minute hourly run ask a few hundred times, not thousands)."""
    return min(SETTLER_BUSY_RETRY_MAX_S, SETTLER_BUSY_RETRY_S * 2 ** min(retries, 10))


@shared_task(name=ToScheduler.METER_RECONCILE, ignore_result=True)
def meter_reconcile():
    reconcile(since=timezone.now() - RECONCILE_WINDOW)


@shared_task(name=ToScheduler.SETTLE_USAGE, ignore_result=True, bind=True, max_retries=None)
def settle_usage(self, workload_id: int | None = None):
    """Hourly for everything pending; at each stop for that workload's segments.

    Where another settlement is running (the hourly one can take minutes), this one comes back later
    (``busy_retry_in``) instead of waiting for it: the scheduler worker has two threads, and one waiting on the
    settlers' lock is one the tick does not get (two stops settling during the hourly run would stop the scheduling
    until it ended).
    """
    segments = None
    if workload_id is not None:
        segments = list(selectors.pending_segments().filter(workload_id=workload_id).values_list("pk", flat=True))
    try:
        done = settlement.settle(segment_ids=segments, wait=False)
    except settlement.SettlerBusy as busy:
        # Its own arguments only: the request's may carry the name of the host that signed it (core.signing),
        # which a message the control plane signs must not repeat.
        raise self.retry(
            args=(), kwargs={"workload_id": workload_id}, exc=busy, countdown=busy_retry_in(self.request.retries)
        ) from busy
    if done.postings:
        log.info("settled %s segments: %s postings, %s", done.segments, done.postings, done.amount)


@shared_task(name=ToScheduler.SEGMENT_ASSIGN, ignore_result=True)
def segment_assign(workload_id: int):
    settlement.segment_assign(workload_id)


@shared_task(name=ToScheduler.SETTLE_STORAGE, ignore_result=True)
def settle_storage():
    storage.storage_settle()


@shared_task(name=ToScheduler.SPOT_PRICES, ignore_result=True)
def spot_prices():
    prices.spot_recompute()


@shared_task(name=ToScheduler.BILLING_ENFORCE, ignore_result=True)
def billing_enforce():
    enforcement.enforce()


@shared_task(name=ToScheduler.LEDGER_VERIFY, ignore_result=True)
def ledger_verify():
    check = ledger_check()
    if not check.ok:
        log.error(
            "LEDGER CHECK FAILED: debits %s, credits %s, mismatched %s", check.debits, check.credits, check.mismatched
        )


@shared_task(name=ToScheduler.SHARED_STORAGE_USAGE, ignore_result=True)
def shared_storage_usage():
    storage.shared_usage_sample()
