"""Storage charges: data disks and the shared file storage per GB-day, once per account and day."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import storage
from billing.models import Posting, PostingKind, SharedStorageUsage, Team
from billing.storage import shared_storage_on, shared_usage_sample, storage_settle
from scheduler import sharedfs
from scheduler.models import Workload
from scheduler.sharedfs import GIB, Quota
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


@pytest.fixture
def shared_on(settings):
    settings.SHARED_FS_META = "sqlite3:///nowhere.db"  # on; these tests never run juicefs


def usage(user, day, *, peak_gb, used_gb=None, quota_gb=20):
    return SharedStorageUsage.objects.create(
        user=user,
        day=day,
        peak_bytes=int(peak_gb * GIB),
        used_bytes=int((peak_gb if used_gb is None else used_gb) * GIB),
        quota_bytes=int(quota_gb * GIB),
        sampled_at=timezone.now(),
    )


def disk(user, *, since, **fields):
    w = workload(user, **fields)
    Workload.objects.filter(pk=w.pk).update(created_at=since)
    return w


def storage_postings(user):
    return Posting.objects.filter(kind=PostingKind.STORAGE, debit__user=user)


def test_a_day_is_charged_for_disks_and_the_shared_storage_peak_above_the_free_allowance(user, card, today):
    yesterday = today - timedelta(days=1)
    disk(user, since=yesterday - timedelta(days=1))  # 10 GB
    usage(user, yesterday.date(), peak_gb=15.5, used_gb=2)
    storage_settle(now=today + timedelta(hours=1))
    posting = storage_postings(user).get(period_start=yesterday)
    # 10 GB disk + 15.5 GB peak of the shared storage - 20 GB free = 5.5 GB at 0.50.
    assert posting.amount == Decimal("2.75")
    assert posting.detail["disk_gb"] == 10 and posting.detail["shared_gb"] == "15.50"


def test_storage_is_charged_once_per_day_however_often_it_is_settled(user, card, today):
    yesterday = today - timedelta(days=1)
    usage(user, yesterday.date(), peak_gb=30)
    storage_settle(now=today)
    storage_settle(now=today + timedelta(hours=5))
    assert storage_postings(user).filter(period_start=yesterday).count() == 1


def test_a_day_without_a_sample_is_charged_at_the_last_usage_sampled_before_it(user, card, today):
    three_days_ago = (today - timedelta(days=3)).date()
    usage(user, three_days_ago, peak_gb=40, used_gb=30)
    charged = shared_storage_on(today - timedelta(days=1))
    assert charged == {user.pk: Decimal("30.00")}  # the latest usage then, not that day's peak
    assert shared_storage_on(today - timedelta(days=3)) == {user.pk: Decimal("40.00")}
    assert shared_storage_on(today - timedelta(days=4)) == {}


def test_the_shared_storage_is_charged_to_the_user_not_to_a_team(user, card, today):
    team = Team.objects.create(slug="lab", name="Lab")
    yesterday = today - timedelta(days=1)
    disk(user, team=team.slug, since=yesterday - timedelta(days=1))
    usage(user, yesterday.date(), peak_gb=25)
    storage_settle(now=today)
    mine = storage_postings(user).get(period_start=yesterday)
    assert mine.detail["disk_gb"] == 0 and mine.amount == Decimal("2.50")  # (25 - 20) x 0.50
    assert not Posting.objects.filter(kind=PostingKind.STORAGE, debit__team=team).exists()  # 10 GB: free


def test_sampling_keeps_the_days_peak_and_the_latest_usage(user, outsider, shared_on, monkeypatch):
    readings = iter([{user.pk: Quota(5 * GIB, 20 * GIB), 10**9: Quota(GIB, GIB)}, {user.pk: Quota(2 * GIB, 20 * GIB)}])
    monkeypatch.setattr(sharedfs, "quotas", lambda: next(readings))
    now = timezone.now().replace(hour=12)
    assert shared_usage_sample(now=now) == 1  # the directory of a user who no longer exists is left out
    assert shared_usage_sample(now=now + timedelta(minutes=15)) == 1
    row = SharedStorageUsage.objects.get(user=user)
    assert (row.peak_bytes, row.used_bytes, row.quota_bytes) == (5 * GIB, 2 * GIB, 20 * GIB)
    assert storage.shared_storage_of(user)["used_bytes"] == 2 * GIB
    assert storage.shared_storage_of(outsider) == {
        "path": "/root/autodl-fs",
        "used_bytes": 0,
        "quota_bytes": 20 * GIB,
        "measured_at": None,
    }


def test_nothing_is_sampled_or_shown_while_the_shared_storage_is_off(user, settings):
    settings.SHARED_FS_META = ""
    assert shared_usage_sample() == 0
    assert storage.shared_storage_of(user) is None


def test_me_shows_my_shared_storage_usage_and_quota(api, user, shared_on):
    usage(user, timezone.now().date(), peak_gb=3, used_gb=1.5)
    body = api.get("/api/v1/me/").json()
    assert body["shared_storage"]["path"] == "/root/autodl-fs"
    assert body["shared_storage"]["used_bytes"] == int(1.5 * GIB)
    assert body["shared_storage"]["quota_bytes"] == 20 * GIB


def test_the_billing_page_shows_my_file_storage(client, user, shared_on):
    usage(user, timezone.now().date(), peak_gb=3, used_gb=1.5)
    client.force_login(user)
    page = client.get("/billing/").content.decode()
    assert "/root/autodl-fs" in page and "1.5\xa0GB used of 20.0\xa0GB" in page
