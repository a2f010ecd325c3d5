"""Storage: data disks, jobs' checkpoint volumes, saved images and shared file storage per GB-day above the free
allowance, charged per UTC day.

A disk is charged for every day it exists — also while its instance is
stopped — until the instance is released; a job's checkpoint volume likewise
(it is kept, at the job's ``disk_gb``, until the job is released). A saved
image (a private image, ready) is charged to its owner at its size for every
day it exists. A user's shared file storage
(``/root/autodl-fs``, ``scheduler.sharedfs``) is charged for what it held:
``shared_usage_sample`` reads every user's usage from JuiceFS (beat, every
``SHARED_FS_USAGE_S``) and keeps each day's peak; a day without a sample is
charged at the last usage sampled before it. Each account is charged once per
day (a unique posting per account and day), for the sum of its instances'
disks and its user's shared storage less the rate card's free allowance (20 GB
by default, as AutoDL). Shared storage is the user's own: it is charged to the
user's wallet, never a team's.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError
from django.db.models import F, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from billing.ledger import payer_for, platform_account, transfer
from billing.models import AccountKind, PostingKind, SharedStorageUsage
from billing.prices import rate_card_now
from billing.rating import CENT
from portal.models import Image, ImageStatus, ImageVisibility
from scheduler import sharedfs
from scheduler.models import Workload, WorkloadEvent, WorkloadKind, WorkloadStatus

CATCH_UP_DAYS = 7
HUNDREDTH = Decimal("0.01")


def disks_on(day_start) -> dict[tuple[int, str], int]:
    """(owner id, team) -> GB of instance disks and job checkpoint volumes that existed during the day."""
    day_end = day_start + timedelta(days=1)
    released_before = WorkloadEvent.objects.filter(to_status=WorkloadStatus.RELEASED, created_at__lt=day_start).values(
        "workload_id"
    )
    disks: dict[tuple[int, str], int] = defaultdict(int)
    rows = (
        Workload.objects.filter(kind__in=[WorkloadKind.INSTANCE, WorkloadKind.JOB], created_at__lt=day_end)
        .exclude(pk__in=released_before)
        .values_list("owner_id", "team", "disk_gb")
    )
    for owner_id, team, gb in rows:
        disks[(owner_id, team)] += gb
    return disks


def shared_usage_sample(now=None) -> int:
    """Record every user's shared storage usage now (today's peak and latest); returns the users sampled.

    Reads JuiceFS's quota table (one ``juicefs quota list``) before touching the
    database, so no transaction waits on the metadata service.
    """
    if not sharedfs.enabled():
        return 0
    usage = sharedfs.quotas()
    now = now or timezone.now()
    day = now.date()
    known = set(get_user_model().objects.filter(pk__in=usage).values_list("pk", flat=True))
    for user_id in known:
        q = usage[user_id]
        latest = dict(used_bytes=q.used_bytes, quota_bytes=q.quota_bytes, sampled_at=now)
        rows = SharedStorageUsage.objects.filter(user_id=user_id, day=day)
        if rows.update(peak_bytes=Greatest(F("peak_bytes"), Value(q.used_bytes)), **latest):
            continue
        try:
            SharedStorageUsage.objects.create(user_id=user_id, day=day, peak_bytes=q.used_bytes, **latest)
        except IntegrityError:  # a concurrent sample made the row first
            rows.update(peak_bytes=Greatest(F("peak_bytes"), Value(q.used_bytes)), **latest)
    return len(known)


def shared_storage_on(day_start) -> dict[int, Decimal]:
    """User id -> GB of shared storage charged for the day: the day's peak, else the last usage sampled before."""
    day = day_start.date()
    rows = SharedStorageUsage.objects.filter(day__lte=day, day__gt=day - timedelta(days=CATCH_UP_DAYS)).order_by(
        "user_id", "-day"
    )
    charged: dict[int, Decimal] = {}
    for row in rows.only("user_id", "day", "peak_bytes", "used_bytes"):
        if row.user_id in charged:
            continue
        held = row.peak_bytes if row.day == day else row.used_bytes
        gb = (Decimal(held) / sharedfs.GIB).quantize(HUNDREDTH, rounding=ROUND_HALF_UP)
        if gb > 0:
            charged[row.user_id] = gb
    return charged


def images_on(day_start) -> dict[int, Decimal]:
    """Owner id -> GB of saved images (private, ready) made before the day's end."""
    rows = Image.objects.filter(
        visibility=ImageVisibility.PRIVATE,
        status=ImageStatus.READY,
        created_at__lt=day_start + timedelta(days=1),
        size_bytes__gt=0,
    ).values_list("owner_id", "size_bytes")
    held: dict[int, int] = defaultdict(int)
    for owner_id, size in rows:
        held[owner_id] += size
    return {
        owner: (Decimal(size) / sharedfs.GIB).quantize(HUNDREDTH, rounding=ROUND_HALF_UP)
        for owner, size in held.items()
    }


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
        per_account: dict[int, tuple[object, int, Decimal]] = {}
        for (owner_id, team), gb in disks_on(day).items():
            account = payer_for(owner_id=owner_id, team_slug=team)
            _, disk, shared = per_account.get(account.pk, (account, 0, Decimal(0)))
            per_account[account.pk] = (account, disk + gb, shared)
        images = images_on(day)
        for user_id, gb in shared_storage_on(day).items():
            account = payer_for(owner_id=user_id, team_slug="")
            _, disk, shared = per_account.get(account.pk, (account, 0, Decimal(0)))
            per_account[account.pk] = (account, disk, shared + gb)
        for user_id in images:  # a saved image is its owner's, as the shared storage
            account = payer_for(owner_id=user_id, team_slug="")
            per_account.setdefault(account.pk, (account, 0, Decimal(0)))
        for account, disk, shared in per_account.values():
            image_gb = images.get(account.user_id, Decimal(0)) if account.user_id else Decimal(0)
            gb = disk + shared + image_gb
            billable = max(gb - card.free_storage_gb, 0)
            amount = (Decimal(billable) * card.storage_gb_day).quantize(CENT, rounding=ROUND_HALF_UP)
            if amount <= 0:
                continue
            detail = {
                "gb": str(gb),
                "disk_gb": disk,
                "shared_gb": str(shared),
                "images_gb": str(image_gb),
                "free_gb": card.free_storage_gb,
                "gb_day": str(card.storage_gb_day),
            }
            try:
                transfer(
                    debit=account,
                    credit=revenue,
                    amount=amount,
                    kind=PostingKind.STORAGE,
                    period_start=day,
                    detail=detail,
                )
                made += 1
            except IntegrityError:
                pass  # that day is charged already
    return made


def shared_storage_of(user) -> dict | None:
    """What the console and the API show of the user's shared storage (None while it is off)."""
    if not sharedfs.enabled():
        return None
    latest = SharedStorageUsage.objects.filter(user=user).order_by("-day").first()
    return {
        "path": settings.SHARED_FS_PATH,
        "used_bytes": latest.used_bytes if latest else 0,
        "quota_bytes": latest.quota_bytes if latest else round(settings.SHARED_FS_QUOTA_GB * sharedfs.GIB),
        "measured_at": latest.sampled_at if latest else None,
    }
