"""Storage: instances' data disks per GB-day above the free allowance, charged per UTC day.

A disk is charged for every day it exists — also while its instance is
stopped — until the instance is released. Each account is charged once per
day (a unique posting per account and day), for the sum of its instances'
disks less the rate card's free allowance (20 GB by default, as AutoDL).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.db import IntegrityError
from django.utils import timezone

from billing.ledger import payer_for, platform_account, transfer
from billing.models import AccountKind, PostingKind
from billing.prices import rate_card_now
from billing.rating import CENT
from scheduler.models import Workload, WorkloadEvent, WorkloadKind, WorkloadStatus

CATCH_UP_DAYS = 7


def disks_on(day_start) -> dict[tuple[int, str], int]:
    """(owner id, team) -> GB of instance disks that existed during the day."""
    day_end = day_start + timedelta(days=1)
    released_before = WorkloadEvent.objects.filter(to_status=WorkloadStatus.RELEASED, created_at__lt=day_start).values(
        "workload_id"
    )
    disks: dict[tuple[int, str], int] = defaultdict(int)
    rows = (
        Workload.objects.filter(kind=WorkloadKind.INSTANCE, created_at__lt=day_end)
        .exclude(pk__in=released_before)
        .values_list("owner_id", "team", "disk_gb")
    )
    for owner_id, team, gb in rows:
        disks[(owner_id, team)] += gb
    return disks


def storage_settle(now=None) -> int:
    """Charge every finished day of the last week not charged yet; returns the postings made."""
    now = now or timezone.now()
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    revenue = platform_account(AccountKind.REVENUE)
    made = 0
    for back in range(CATCH_UP_DAYS, 0, -1):
        day = today - timedelta(days=back)
        card = rate_card_now("", day)
        if card is None:
            continue
        per_account: dict[int, tuple[object, int]] = {}
        for (owner_id, team), gb in disks_on(day).items():
            account = payer_for(owner_id=owner_id, team_slug=team)
            held = per_account.get(account.pk, (account, 0))[1]
            per_account[account.pk] = (account, held + gb)
        for account, gb in per_account.values():
            billable = max(gb - card.free_storage_gb, 0)
            amount = (Decimal(billable) * card.storage_gb_day).quantize(CENT, rounding=ROUND_HALF_UP)
            if amount <= 0:
                continue
            try:
                transfer(
                    debit=account,
                    credit=revenue,
                    amount=amount,
                    kind=PostingKind.STORAGE,
                    period_start=day,
                    detail={"gb": gb, "free_gb": card.free_storage_gb, "gb_day": str(card.storage_gb_day)},
                )
                made += 1
            except IntegrityError:
                pass  # that day is charged already
    return made
