"""What a user keeps on disk besides instance disks is charged too: job checkpoint volumes and saved images."""

from datetime import timedelta
from decimal import Decimal

import pytest

from billing.models import Posting, PostingKind
from billing.storage import storage_settle
from portal.models import Image
from scheduler.models import Workload, WorkloadEvent
from scheduler.sharedfs import GIB
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


def charged(user, day) -> Posting:
    storage_settle(now=day + timedelta(days=1, hours=1))
    return Posting.objects.get(kind=PostingKind.STORAGE, debit__user=user, period_start=day)


def saved_image(owner, *, gb, status="ready", since):
    return Image.objects.create(
        name="mine", framework="x", framework_version="1", cuda_version="12", visibility="private", owner=owner,
        docker_ref="registry.local/u/mine:1", status=status, size_bytes=int(gb * GIB), created_at=since,
    )  # fmt: skip


def test_a_jobs_checkpoint_volume_is_charged_until_the_job_is_released(user, card, today):
    yesterday = today - timedelta(days=1)
    job = workload(user, kind="job", status="succeeded")  # its volume (10 GB) stays after it ends
    Workload.objects.filter(pk=job.pk).update(created_at=yesterday - timedelta(days=2), disk_gb=30)
    posting = charged(user, yesterday)
    assert posting.detail["disk_gb"] == 30 and posting.amount == Decimal("5.00")  # (30 - 20) GB at 0.50


def test_a_released_jobs_checkpoint_volume_is_not_charged_after_its_release(user, card, today):
    yesterday = today - timedelta(days=1)
    job = workload(user, kind="job", status="released")
    Workload.objects.filter(pk=job.pk).update(created_at=yesterday - timedelta(days=2), disk_gb=30)
    WorkloadEvent.objects.create(workload=job, from_status="succeeded", to_status="released", reason="released")
    WorkloadEvent.objects.filter(workload=job).update(created_at=yesterday - timedelta(hours=1))
    storage_settle(now=today + timedelta(hours=1))
    assert not Posting.objects.filter(kind=PostingKind.STORAGE, debit__user=user, period_start=yesterday).exists()


def test_a_saved_image_is_charged_to_its_owner_at_its_size(user, outsider, card, today):
    yesterday = today - timedelta(days=1)
    saved_image(user, gb=26.5, since=yesterday - timedelta(days=1))
    saved_image(user, gb=100, status="failed", since=yesterday - timedelta(days=1))  # nothing kept
    saved_image(user, gb=100, since=today + timedelta(hours=2))  # made after the day
    posting = charged(user, yesterday)
    assert posting.detail["images_gb"] == "26.50"
    assert posting.amount == Decimal("3.25")  # (26.5 - 20) GB at 0.50
    assert not Posting.objects.filter(kind=PostingKind.STORAGE, debit__user=outsider).exists()
