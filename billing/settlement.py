"""Settlement: metered segments become usage postings — hourly while work runs, and at each stop.

A batch of segments is settled in one transaction, one settler at a time (a
transaction-level advisory lock on PostgreSQL; a second settler waits, then
reads what the first wrote): their charge lines computed from ``settled_until`` (``rating.charge_lines``), the postings
inserted (unique per segment and period), balances moved and ``settled_until``
advanced. Killed half way, the transaction is rolled back and the next run
computes exactly the same lines: never a double charge, never a lost one.

Open segments are settled only for whole hours and only while their work is
still running when read, so their end — recorded later — cannot fall inside
an hour already charged.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db import connection, transaction
from django.db.models import F, Max, Min, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from billing.ledger import payer_for, platform_account
from billing.models import Account, AccountKind, MeterSegment, Posting, PostingKind, RateCard, SpotPrice
from billing.rating import Rate, Shape, Timeline, charge_lines
from scheduler.models import WorkloadStatus
from scheduler.policy.cluster import WHOLE_CARD

log = logging.getLogger(__name__)
BATCH = 20000
SETTLEMENT_LOCK = 0x6770_5345_544C  # pg_advisory_xact_lock key: one settling transaction at a time


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
        card.spot_ceiling,
    )


def timelines(since=None) -> dict[str, Timeline]:
    """Per GPU type (and "" for the default card): its rate cards and spot prices.

    With ``since``, only the spot prices that can be in force from then on (from the earliest of
    those in force at ``since``): a price recomputed every few minutes makes a long history.
    """
    rates: dict[str, list[Rate]] = defaultdict(list)
    for card in RateCard.objects.all():
        rates[card.gpu_model].append(rate_of(card))
    prices = SpotPrice.objects.all()
    if since is not None:
        in_force = SpotPrice.objects.filter(effective_from__lte=since).values("gpu_model")
        in_force = in_force.annotate(t=Max("effective_from")).values_list("t", flat=True)
        prices = prices.filter(effective_from__gte=min(in_force, default=since))
    spots: dict[str, list] = defaultdict(list)
    for model, t, price in prices.values_list("gpu_model", "effective_from", "card_hour"):
        spots[model].append((t, price))
    return {model: Timeline(list(r), spots.get(model, [])) for model, r in rates.items()}


def timeline_for(lines: dict[str, Timeline], gpu_model: str) -> Timeline | None:
    """The GPU type's own rates, else the default card's (None when neither exists)."""
    return lines.get(gpu_model) or lines.get("")


def shape_of(segment) -> Shape:
    """What a segment's work holds (``segment.workload`` loaded); no_gpu and spot are the segment's own."""
    workload = segment.workload
    return Shape(
        gpu_model=workload.gpu_model,
        cards=workload.gpu_count,
        milli=workload.gpu_milli,
        cpu_cores=workload.cpu_cores,
        memory_mb=workload.memory_mb,
        spot=segment.spot,
        no_gpu=segment.no_gpu,
    )


def segment_assign(workload_id: int) -> int:
    """Record who pays and the rate in force on a workload's open segment (at its start).

    Settlement does it itself when this did not run; done early, settling only
    moves ``settled_until`` and PostgreSQL re-checks no foreign key.
    """
    segment = MeterSegment.objects.filter(workload_id=workload_id, ended_at__isnull=True, account__isnull=True)
    segment = segment.select_related("workload").first()
    if segment is None:
        return 0
    workload = segment.workload
    timeline = timeline_for(timelines(since=segment.started_at), workload.gpu_model)
    try:
        rate_id = timeline.rate_at(segment.started_at).id if timeline else None
    except LookupError:
        rate_id = None
    account = payer_for(owner_id=workload.owner_id, team_slug=workload.team)
    unassigned = MeterSegment.objects.filter(pk=segment.pk, account__isnull=True)
    return unassigned.update(account=account, rate_card_id=rate_id)


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
    since = segments.aggregate(t=Min(Coalesce("settled_until", "started_at")))["t"]
    lines = timelines(since=since or now)
    revenue = platform_account(AccountKind.REVENUE)
    payers: dict[tuple[int, str], int] = {}
    total = Settled()
    for start in range(0, len(ids), batch):
        done = _settle_batch(ids[start : start + batch], now, lines, revenue, payers)
        total.segments += done.segments
        total.postings += done.postings
        total.amount += done.amount
    return total


SEGMENT_COLUMNS = (
    "pk",
    "started_at",
    "ended_at",
    "settled_until",
    "account_id",
    "rate_card_id",
    "workload__status",
    "workload__gpu_model",
    "workload__gpu_count",
    "workload__gpu_milli",
    "workload__cpu_cores",
    "workload__memory_mb",
    "spot",
    "workload__owner_id",
    "workload__team",
    "no_gpu",
)


def _settle_batch(ids: list[int], now, lines: dict[str, Timeline], revenue: Account, payers: dict) -> Settled:
    done = Settled()
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # One settling transaction at a time (a second waits, then reads what the first wrote), instead
            # of locking every segment row: row locks on 100,000 segments cost more than the settling.
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SETTLEMENT_LOCK])
        rows = _segment_rows(ids)
        postings, updates = [], []
        moved: dict[int, Decimal] = defaultdict(Decimal)
        for (
            pk,
            started,
            ended,
            settled,
            account_id,
            rate_id,
            status,
            model,
            cards,
            milli,
            cores,
            mem,
            spot,
            owner,
            team,
            no_gpu,
        ) in rows:
            if ended is None and status != WorkloadStatus.RUNNING:
                continue  # its end is being recorded: settle it once it is
            timeline = timeline_for(lines, model)
            if timeline is None:
                log.error("no rate card for %s: segment %s is not settled", model, pk)
                continue
            shape = Shape(model, cards, milli, cores, mem, spot, no_gpu)
            try:
                new_lines, settled_until = charge_lines(
                    shape, started_at=started, ended_at=ended, settled_until=settled, settle_to=now, timeline=timeline
                )
            except LookupError as exc:
                log.error("segment %s: %s", pk, exc)
                continue
            if settled_until is None:
                continue
            if account_id is None:
                if (owner, team) not in payers:
                    payers[owner, team] = payer_for(owner_id=owner, team_slug=team).pk
                account_id = payers[owner, team]
            if rate_id is None:
                rate_id = timeline.rate_at(started).id
            share = cards * milli / WHOLE_CARD
            for line in new_lines:
                postings.append((pk, account_id, line, line.seconds * share))
                moved[account_id] -= line.amount
                done.amount += line.amount
            moved[revenue.pk] += sum((line.amount for line in new_lines), Decimal(0))
            updates.append((pk, settled_until, account_id, rate_id))
        (_write_postgresql if connection.vendor == "postgresql" else _write_orm)(postings, updates, revenue, now)
        _balances_move({account_id: delta for account_id, delta in moved.items() if delta})
    done.segments, done.postings = len(updates), len(postings)
    return done


def _balances_move(deltas: dict[int, Decimal]) -> None:
    """Add each delta to its account's balance: on PostgreSQL the rows locked in id order, one UPDATE."""
    if connection.vendor != "postgresql":
        for account_id, delta in deltas.items():
            Account.objects.filter(pk=account_id).update(balance=F("balance") + delta)
        return
    ids = sorted(deltas)
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM billing_account WHERE id = ANY(%s) ORDER BY id FOR UPDATE", [ids])
        cursor.execute(
            "UPDATE billing_account a SET balance = a.balance + v.delta "
            "FROM unnest(%s::bigint[], %s::numeric[]) AS v(id, delta) WHERE a.id = v.id",
            [ids, [deltas[i] for i in ids]],
        )


# Times travel as microseconds since the epoch: psycopg reads and writes integers in C, while each
# timestamp goes through Python (Django's time-zone loader), a large part of settling 100,000 rows.
EPOCH, MICROSECOND = datetime(1970, 1, 1, tzinfo=UTC), timedelta(microseconds=1)
SEGMENT_SQL = (
    "SELECT s.id, (extract(epoch FROM s.started_at) * 1000000)::bigint, "
    "(extract(epoch FROM s.ended_at) * 1000000)::bigint, (extract(epoch FROM s.settled_until) * 1000000)::bigint, "
    "s.account_id, s.rate_card_id, w.status, w.gpu_model, "
    "w.gpu_count, w.gpu_milli, w.cpu_cores, w.memory_mb, s.spot, w.owner_id, w.team, s.no_gpu "
    "FROM billing_metersegment s JOIN scheduler_workload w ON w.id = s.workload_id WHERE s.id = ANY(%s::bigint[])"
)


def _bigints(values) -> str:
    """A list of integers as a PostgreSQL array literal (for ``%s::bigint[]``): joined in C, where
    psycopg adapts a list element by element in Python (0.6 s for a settlement's arrays)."""
    return "{" + ",".join(map(str, values)) + "}"


def _segment_rows(ids: list[int]):
    """The batch's segments with what rating needs of their work (one plain query on PostgreSQL)."""
    if connection.vendor != "postgresql":
        return MeterSegment.objects.filter(pk__in=ids).values_list(*SEGMENT_COLUMNS)
    with connection.cursor() as cursor:
        cursor.execute(SEGMENT_SQL, [_bigints(ids)])
        return [
            (pk, _time(started), _time(ended), _time(settled), *rest)
            for pk, started, ended, settled, *rest in cursor.fetchall()
        ]


def _time(microseconds: int | None) -> datetime | None:
    return None if microseconds is None else EPOCH + timedelta(microseconds=microseconds)


POSTING_COPY = (
    "COPY billing_posting (created_at, kind, debit_id, credit_id, amount, currency, segment_id, period_start, "
    "seconds, gpu_seconds, detail, memo) FROM STDIN"
)


def _write_postgresql(postings, updates, revenue: Account, now) -> None:
    """COPY the postings in (the unique index still refuses a period charged twice), one UPDATE for segments.

    The COPY's text is written here rather than row by row through psycopg's adapters: every field
    is a number, a fixed word or an ISO time, and the one free text, the JSON detail, has its
    backslashes doubled (JSON escapes tabs and newlines itself).
    """
    head = f"{now.isoformat()}\t{PostingKind.USAGE}\t"
    tail = f"\t{revenue.pk}\t"
    currency = f"\t{revenue.currency}\t"
    periods: dict[datetime, str] = {}
    rows = []
    for segment_id, debit_id, line, gpu_seconds in postings:
        period = periods.get(line.period_start) or periods.setdefault(line.period_start, line.period_start.isoformat())
        detail = json.dumps({"pieces": line.pieces}).replace("\\", "\\\\")
        rows.append(
            f"{head}{debit_id}{tail}{line.amount}{currency}{segment_id}\t{period}\t{line.seconds!r}\t"
            f"{float(gpu_seconds)!r}\t{detail}\t\n"
        )
    with connection.cursor() as cursor:
        with cursor.copy(POSTING_COPY) as copy:
            copy.write("".join(rows))
        if updates:
            ids, until, accounts, rates = map(list, zip(*updates, strict=True))
            # "s.id = ANY": the batch's rows found through the primary key; joined to the arrays alone, the
            # planner reads the whole table (a million segments of history) once per batch.
            cursor.execute(
                "UPDATE billing_metersegment s SET settled_until = 'epoch'::timestamptz + v.until * interval '1 us', "
                "account_id = v.account, rate_card_id = v.rate "
                "FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[]) "
                "AS v(id, until, account, rate) WHERE s.id = v.id AND s.id = ANY(%s::bigint[])",
                [
                    _bigints(ids),
                    _bigints((t - EPOCH) // MICROSECOND for t in until),
                    _bigints(accounts),
                    _bigints(rates),
                    _bigints(ids),
                ],
            )


def _write_orm(postings, updates, revenue: Account, now) -> None:
    Posting.objects.bulk_create(
        [
            Posting(
                kind=PostingKind.USAGE,
                debit_id=debit_id,
                credit_id=revenue.pk,
                amount=line.amount,
                currency=revenue.currency,
                segment_id=segment_id,
                period_start=line.period_start,
                seconds=line.seconds,
                gpu_seconds=gpu_seconds,
                detail={"pieces": line.pieces},
            )
            for segment_id, debit_id, line, gpu_seconds in postings
        ],
        batch_size=500,
    )
    MeterSegment.objects.bulk_update(
        [MeterSegment(pk=pk, settled_until=until, account_id=a, rate_card_id=r) for pk, until, a, r in updates],
        ["settled_until", "account", "rate_card"],
        batch_size=500,
    )
