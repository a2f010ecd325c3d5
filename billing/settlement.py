"""Settlement: metered segments become usage postings — hourly while work runs, and at each stop.

A batch of segments is settled in one transaction: the segments are locked
(``SKIP LOCKED``: a concurrent settler takes others), their charge lines
computed from ``settled_until`` (``rating.charge_lines``), the postings
inserted (unique per segment and period), balances moved and ``settled_until``
advanced. Killed half way, the transaction is rolled back and the next run
computes exactly the same lines: never a double charge, never a lost one.

Open segments are settled only for whole hours and only while their work is
still running when read, so their end — recorded later — cannot fall inside
an hour already charged.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from billing.ledger import payer_for, platform_account
from billing.models import Account, AccountKind, MeterSegment, Posting, PostingKind, RateCard, SpotPrice
from billing.rating import Rate, Shape, Timeline, charge_lines
from scheduler.models import WorkloadStatus
from scheduler.services.bulk import rows_update

log = logging.getLogger(__name__)
BATCH = 5000


@dataclass
class Settled:
    segments: int = 0
    postings: int = 0
    amount: Decimal = Decimal("0.00")


def rate_of(card: RateCard) -> Rate:
    return Rate(
        card.pk,
        card.effective_from,
        card.card_hour,
        card.cpus_per_card,
        card.memory_gb_per_card,
        card.cpu_core_hour,
        card.memory_gb_hour,
        card.no_gpu_hour,
    )


def timelines() -> dict[str, Timeline]:
    """Per GPU type (and "" for the default card): its rate cards and spot prices."""
    rates: dict[str, list[Rate]] = defaultdict(list)
    for card in RateCard.objects.all():
        rates[card.gpu_model].append(rate_of(card))
    spots: dict[str, list] = defaultdict(list)
    for model, t, price in SpotPrice.objects.values_list("gpu_model", "effective_from", "card_hour"):
        spots[model].append((t, price))
    return {model: Timeline(list(r), spots.get(model, [])) for model, r in rates.items()}


def shape_of(workload) -> Shape:
    return Shape(
        gpu_model=workload.gpu_model,
        cards=workload.gpu_count,
        milli=workload.gpu_milli,
        cpu_cores=workload.cpu_cores,
        memory_mb=workload.memory_mb,
        spot=workload.spot,
    )


def pending_segments():
    """Segments with time not yet charged: closed ones short of their end, open ones of running work."""
    return MeterSegment.objects.filter(
        Q(ended_at__isnull=False, settled_until__isnull=True)
        | Q(ended_at__isnull=False, settled_until__lt=F("ended_at"))
        | Q(ended_at__isnull=True, workload__status=WorkloadStatus.RUNNING)
    )


def settle(*, now=None, segment_ids: list[int] | None = None, batch: int = BATCH) -> Settled:
    now = now or timezone.now()
    segments = pending_segments()
    if segment_ids is not None:
        segments = segments.filter(pk__in=segment_ids)
    ids = list(segments.order_by("pk").values_list("pk", flat=True))
    lines = timelines()
    revenue = platform_account(AccountKind.REVENUE)
    total = Settled()
    for start in range(0, len(ids), batch):
        done = _settle_batch(ids[start : start + batch], now, lines, revenue)
        total.segments += done.segments
        total.postings += done.postings
        total.amount += done.amount
    return total


def _settle_batch(ids: list[int], now, lines: dict[str, Timeline], revenue: Account) -> Settled:
    done = Settled()
    with transaction.atomic():
        locked = (
            MeterSegment.objects.filter(pk__in=ids)
            .select_for_update(skip_locked=True, of=("self",))
            .select_related("workload")
        )
        postings, changed = [], []
        moved: dict[int, Decimal] = defaultdict(Decimal)
        payers: dict[tuple[int, str], Account] = {}
        for segment in locked:
            workload = segment.workload
            if segment.ended_at is None and workload.status != WorkloadStatus.RUNNING:
                continue  # its end is being recorded: settle it once it is
            timeline = lines.get(workload.gpu_model) or lines.get("")
            if timeline is None:
                log.error("no rate card for %s: segment %s is not settled", workload.gpu_model, segment.pk)
                continue
            try:
                new_lines, settled_until = charge_lines(
                    shape_of(workload),
                    started_at=segment.started_at,
                    ended_at=segment.ended_at,
                    settled_until=segment.settled_until,
                    settle_to=now,
                    timeline=timeline,
                )
            except LookupError as exc:
                log.error("segment %s: %s", segment.pk, exc)
                continue
            if settled_until is None:
                continue
            if segment.account_id is None:
                key = (workload.owner_id, workload.team)
                if key not in payers:
                    payers[key] = payer_for(owner_id=workload.owner_id, team_slug=workload.team)
                segment.account = payers[key]
            if segment.rate_card_id is None:
                segment.rate_card_id = timeline.rate_at(segment.started_at).id
            share = workload.gpu_count * workload.gpu_milli / 1000
            for line in new_lines:
                postings.append(
                    Posting(
                        kind=PostingKind.USAGE,
                        debit_id=segment.account_id,
                        credit_id=revenue.pk,
                        amount=line.amount,
                        currency=revenue.currency,
                        segment_id=segment.pk,
                        period_start=line.period_start,
                        seconds=line.seconds,
                        gpu_seconds=line.seconds * share,
                        detail={"rate": line.rate_id, "pieces": line.pieces},
                    )
                )
                moved[segment.account_id] -= line.amount
                moved[revenue.pk] += line.amount
                done.amount += line.amount
            segment.settled_until = settled_until
            changed.append(segment)
        Posting.objects.bulk_create(postings, batch_size=2000)
        for account_id, delta in moved.items():
            if delta:
                Account.objects.filter(pk=account_id).update(balance=F("balance") + delta)
        rows_update(MeterSegment, changed, ["settled_until", "account", "rate_card"])
    done.segments, done.postings = len(changed), len(postings)
    return done
