"""Crash safety: kill -9 a settlement half way, settle again, and the ledger equals the metered usage."""

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.conf import settings
from django.db import connection
from django.db.models import Count, Sum

from billing.ledger import ledger_check
from billing.models import MeterSegment, Posting, PostingKind, RateCard
from billing.rating import Rate, Shape, Timeline, charge_lines
from billing.settlement import settle
from scheduler.models import Workload, WorkloadStatus
from tests.conftest import database_url, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]
START = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
SEGMENTS = 3000


def metered_total(segments, timeline) -> tuple[Decimal, int]:
    """What the metered segments cost, computed from scratch with the pure rules."""
    amount, lines = Decimal(0), 0
    for s in segments:
        w = s.workload
        shape = Shape(w.gpu_model, w.gpu_count, w.gpu_milli, w.cpu_cores, w.memory_mb, w.spot)
        new, _ = charge_lines(
            shape,
            started_at=s.started_at,
            ended_at=s.ended_at,
            settled_until=None,
            settle_to=s.ended_at,
            timeline=timeline,
        )
        amount += sum(line.amount for line in new)
        lines += len(new)
    return amount, lines


def test_a_settlement_killed_half_way_and_run_again_charges_exactly_what_was_metered(user):
    if connection.vendor != "postgresql":
        pytest.fail("run on PostgreSQL (make test does)")
    card = RateCard.objects.create(
        gpu_model="RTX3090", effective_from=START - timedelta(days=1), card_hour=Decimal("1.58")
    )
    dearer = RateCard.objects.create(
        gpu_model="RTX3090", effective_from=START + timedelta(hours=5), card_hour=Decimal("2.10")
    )
    workloads = Workload.objects.bulk_create(
        Workload(
            owner=user,
            kind="job",
            name=f"w{i}",
            image_ref="x",
            gpu_model="RTX3090",
            gpu_count=1,
            gpu_milli=(i % 10 + 1) * 100,
            cpu_cores=1 + i % 12,
            memory_mb=1024,
            disk_gb=10,
            status=WorkloadStatus.SUCCEEDED,
        )
        for i in range(SEGMENTS)
    )
    MeterSegment.objects.bulk_create(
        MeterSegment(
            workload=w,
            started_at=START + timedelta(seconds=37 * i),
            ended_at=START + timedelta(seconds=37 * i + (i * 7919) % 9000),
        )
        for i, w in enumerate(workloads)
    )
    env = {**os.environ, "DATABASE_URL": database_url(), "DB_CONN_MAX_AGE": "0"}
    process = subprocess.Popen(
        [sys.executable, "manage.py", "settle", "--batch", "25"],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: Posting.objects.filter(kind=PostingKind.USAGE).count() >= 500,
            timeout=120,
            what="the settlement to commit some batches",
        )
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
    segments = list(MeterSegment.objects.select_related("workload"))
    timeline = Timeline(
        [
            Rate(
                c.pk,
                c.effective_from,
                c.card_hour,
                c.cpus_per_card,
                c.memory_gb_per_card,
                c.cpu_core_hour,
                c.memory_gb_hour,
                c.no_gpu_hour,
            )
            for c in (card, dearer)
        ]
    )
    expected_amount, expected_lines = metered_total(segments, timeline)
    charged_before = Posting.objects.filter(kind=PostingKind.USAGE).count()
    assert charged_before < expected_lines, "the kill landed half way (otherwise this test proves nothing)"
    assert ledger_check().ok, "what the killed run committed is whole batches"

    settle(now=START + timedelta(days=2))
    usage = Posting.objects.filter(kind=PostingKind.USAGE)
    totals = usage.aggregate(amount=Sum("amount"), lines=Count("id"))
    assert (totals["amount"], totals["lines"]) == (expected_amount, expected_lines)
    assert usage.values("segment", "period_start").distinct().count() == expected_lines
    assert ledger_check().ok
