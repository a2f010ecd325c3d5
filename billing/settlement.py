"""Settlement: metered segments become usage postings — hourly while work runs, and at each stop.

One settler at a time (an advisory lock on PostgreSQL; a second settler waits, then reads what the first wrote —
or, as the worker's tasks ask, comes back later). Segments are settled in batches, one transaction each: their
charge lines computed from ``settled_until`` (``rating.lines_between``), the postings inserted (unique per
segment and period), balances moved and ``settled_until`` advanced. Killed half way, the batch's transaction is
rolled back and the next run computes exactly the same lines: never a double charge, never a lost one.
Rating (pure Python) runs in a second thread, a batch ahead of the writing.

Open segments are settled only for whole hours and only while their work is
still running when read, so their end — recorded later — cannot fall inside
an hour already charged.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import defaultdict, deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from functools import partial
from itertools import islice

from django.db import DatabaseError, IntegrityError, connection, connections, transaction
from django.db.models import BigIntegerField, F, Func, Min
from django.db.models.functions import Coalesce
from django.utils import timezone

from billing.ledger import payer_for, platform_account
from billing.models import Account, AccountKind, MeterSegment, Posting, PostingKind
from billing.rating import Line, Pricer, Shape, Timeline, lines_between, micros, moment
from billing.selectors import pending_segments, timeline_for, timelines
from core.memory import collector_paused
from core.pg_arrays import int_array
from scheduler.models import WorkloadStatus, card_share

log = logging.getLogger(__name__)
BATCH = 10000  # per transaction; 10,000 overlapped rating and writing best (bench/billing_settle.py)
SETTLEMENT_LOCK = 0x6770_5345_544C  # advisory lock key: one settler at a time


class SettlerBusy(Exception):
    """Another settler holds the lock, and this one was asked not to wait (``settle(wait=False)``)."""


@dataclass
class Settled:
    segments: int = 0
    postings: int = 0
    amount: Decimal = Decimal("0.00")


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


def settle(*, now=None, segment_ids: list[int] | None = None, batch: int = BATCH, wait: bool = True) -> Settled:
    """Settle what is pending (or those of ``segment_ids`` that are), ``batch`` segments per transaction.

    One settler at a time (``_one_settler``): a second waits for the first, or with ``wait=False`` raises
    ``SettlerBusy`` at once (the scheduler worker's tasks: a thread waiting there is one the tick lacks).

    The batches go through a pipeline of two threads: while this one writes batch k, a second reads batch k+1 on its
    own connection (``_pending_batches``: one query for the whole run, read batch by batch; payers not yet recorded
    filled in) and rates it (``_rate_batch``: pure Python), so reading, pricing and writing overlap instead of
    taking turns (the database waits release the GIL). Inside a caller's transaction the batches are read here
    instead, on the one connection that sees the caller's rows. Python's garbage collector is paused for the run
    (``collector_paused``): its full collections over the piling lines held the GIL the writing thread waits for.
    (Measured and left out: smaller first and last batches; two batches written at once on two connections: within
    the noise, the database and the rating share two cores.)
    """
    now = now or timezone.now()
    total = Settled()
    with _one_settler(wait=wait), collector_paused():
        segments = pending_segments()
        if segment_ids is not None:
            segments = segments.filter(pk__in=segment_ids)
        since = segments.aggregate(t=Min(Coalesce("settled_until", "started_at")))["t"]
        if since is None:
            return total  # nothing pending
        lines = timelines(since=since)
        revenue = platform_account(AccountKind.REVENUE)
        postgresql = connection.vendor == "postgresql"
        rate = partial(_rate_batch, now=now, lines=lines, since=micros(since), revenue=revenue, postgresql=postgresql)
        payers: dict[tuple[int, str], int] = {}
        batches = _pending_batches(segments, batch, payers)  # one query, run at the first batch's read
        # Outside a caller's transaction the rating thread reads the batches itself, on its own connection,
        # so that reading overlaps the writing too; inside one, only this connection sees the caller's rows.
        reads_apart = postgresql and not connection.in_atomic_block
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="settle-rating") as rater:

            def rated() -> Future:  # the next batch rated (None once all are)
                if reads_apart:  # read in the rating thread, on its own connection
                    return rater.submit(lambda: rate(next(batches, None)))
                return rater.submit(rate, next(batches, None))

            ahead: deque[Future] = deque()
            try:
                ahead += [rated(), rated()]
                while (rated_batch := ahead.popleft().result()) is not None:
                    ahead.append(rated())
                    _write_batch(rated_batch, revenue, now)
                    total.segments += len(rated_batch.updates)
                    total.postings += len(rated_batch.postings)
                    total.amount += rated_batch.amount
            finally:
                if reads_apart:  # in the rating thread, after its last read: the cursor, then its connection
                    rater.submit(batches.close)
                    rater.submit(connections.close_all)
                else:
                    batches.close()
    return total


@contextlib.contextmanager
def _one_settler(*, wait: bool = True):
    """One settler at a time on PostgreSQL: a second waits, then reads what the first wrote (or, not to wait,
    raises ``SettlerBusy``).

    An advisory lock instead of locking every segment row (row locks on 100,000 segments cost more
    than the settling): inside a caller's transaction a transaction lock, held to its end; else a
    session lock, released at the end (or with the connection, if the process dies).
    """
    if connection.vendor != "postgresql":
        yield
        return
    session = not connection.in_atomic_block  # else a transaction lock, released with the caller's transaction
    function = f"pg_{'' if wait else 'try_'}advisory{'' if session else '_xact'}_lock"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}(%s)", [SETTLEMENT_LOCK])
        if not wait and not cursor.fetchone()[0]:
            raise SettlerBusy("another settlement holds the settlers' lock")
    try:
        yield
    finally:
        if session:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [SETTLEMENT_LOCK])
            except DatabaseError:  # the connection is gone, and the lock with it; never keep a broken one
                connection.close()


SEGMENT_COLUMNS = (
    "pk",
    "started_us",
    "ended_us",
    "settled_us",
    "account_id",
    "rate_card_id",
    "workload__status",
    "workload__gpu_model",
    "held_cards",  # the segment's own (an elastic job's size of that run), else its work's
    "workload__gpu_milli",
    "workload__cpu_cores",
    "workload__memory_mb",
    "spot",
    "workload__owner_id",
    "workload__team",
    "no_gpu",
)
ACCOUNT, OWNER, TEAM = (SEGMENT_COLUMNS.index(c) for c in ("account_id", "workload__owner_id", "workload__team"))


class EpochMicros(Func):
    """A time as microseconds since the epoch, exactly (PostgreSQL's ``extract`` is a numeric): psycopg
    reads integers in C, where each timestamp goes through Python (Django's time-zone loader), a large
    part of settling 100,000 rows. Other databases send the time itself (``_rate_batch`` converts it)."""

    output_field = BigIntegerField()
    template = "(EXTRACT(EPOCH FROM %(expressions)s) * 1000000)::bigint"


SEGMENT_TIMES = {"started_us": "started_at", "ended_us": "ended_at", "settled_us": "settled_until"}


def _pending_batches(segments, batch: int, payers: dict[tuple[int, str], int]) -> Iterator[list[tuple]]:
    """The pending ``segments`` with what rating needs of their work, in id order, ``batch`` at a time, payers
    filled in: one query, read through a server-side cursor on the connection of the thread that takes the
    first batch (10,000 lookups by id per batch cost PostgreSQL ~0.9 s of a 100,000-segment run)."""
    segments = segments.annotate(held_cards=Coalesce("cards", "workload__gpu_count"))
    if connection.vendor == "postgresql":
        rows = segments.annotate(**{name: EpochMicros(column) for name, column in SEGMENT_TIMES.items()})
        columns = SEGMENT_COLUMNS
    else:
        rows, columns = segments, [SEGMENT_TIMES.get(column, column) for column in SEGMENT_COLUMNS]
    rows = rows.order_by("pk").values_list(*columns).iterator(chunk_size=batch)
    while chunk := list(islice(rows, batch)):
        yield _payers_recorded(chunk, payers)


def _payers_recorded(rows: list[tuple], payers: dict[tuple[int, str], int]) -> list[tuple]:
    """The rows with the payer filled in where ``segment_assign`` did not record it (looked up once per
    owner and team)."""
    filled = []
    for row in rows:
        if row[ACCOUNT] is None:
            owner, team = row[OWNER], row[TEAM]
            if (owner, team) not in payers:
                payers[owner, team] = payer_for(owner_id=owner, team_slug=team).pk
            row = (*row[:ACCOUNT], payers[owner, team], *row[ACCOUNT + 1 :])
        filled.append(row)
    return filled


@dataclass
class RatedBatch:
    """A batch's charges, ready to write: postings (segment, payer, line, GPU-seconds), segment updates
    (segment, new settled_until in microseconds since the epoch, payer, rate), balance moves, their sum
    and (PostgreSQL) the COPY text."""

    postings: list[tuple[int, int, Line, float]] = field(default_factory=list)
    updates: list[tuple[int, int, int, int]] = field(default_factory=list)
    moved: dict[int, Decimal] = field(default_factory=lambda: defaultdict(Decimal))
    amount: Decimal = Decimal("0.00")
    copy_text: str = ""


def _rate_batch(
    rows: list[tuple] | None, *, now, lines: dict[str, Timeline], since: int, revenue: Account, postgresql: bool
) -> RatedBatch | None:
    """Charge lines for a batch's segments, from ``settled_until`` to their end (open ones: to the last
    whole hour before ``now``); None for no batch. Pure: it runs in the rating thread and touches no
    database. On PostgreSQL, the rows' times come as microseconds and the result carries the COPY text.
    ``lines`` hold the prices from ``since`` (microseconds) on: a segment that became pending with an
    earlier start after they were read waits for the next run."""
    if rows is None:
        return None
    done = RatedBatch()
    moved = done.moved
    pricers: dict[tuple, Pricer] = {}  # per shape: its prices are worked out once per stretch
    settle_to = micros(now)
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
        _owner,
        _team,
        no_gpu,
    ) in rows:
        if ended is None and status != WorkloadStatus.RUNNING:
            continue  # its end is being recorded: settle it once it is
        if not postgresql:
            started, ended, settled = (None if t is None else micros(t) for t in (started, ended, settled))
        if (started if settled is None else settled) < since:
            continue  # pending since ``lines`` were read, from before them: the next run settles it
        key = (model, cards, milli, cores, mem, spot, no_gpu)
        pricer = pricers.get(key)
        if pricer is None:
            timeline = timeline_for(lines, model)
            if timeline is None:
                log.error("no rate card for %s: segment %s is not settled", model, pk)
                continue
            pricer = pricers[key] = Pricer(Shape(*key), timeline)
        try:
            new_lines, settled_until = lines_between(
                pricer, started=started, ended=ended, settled=settled, settle_to=settle_to
            )
        except LookupError as exc:
            log.error("segment %s: %s", pk, exc)
            continue
        if settled_until is None:
            continue
        if rate_id is None:
            rate_id = pricer.at(started)[2].id
        share = card_share(cards, milli, no_gpu=no_gpu)  # a stretch run without a card used no GPU-seconds
        charged = Decimal(0)
        for line in new_lines:
            done.postings.append((pk, account_id, line, line.seconds * share))
            charged += line.amount
        moved[account_id] -= charged
        moved[revenue.pk] += charged
        done.amount += charged
        done.updates.append((pk, settled_until, account_id, rate_id))
    if postgresql:
        done.copy_text = _copy_text(done.postings, revenue, now)
    return done


def _write_batch(rated: RatedBatch, revenue: Account, now) -> None:
    """One transaction: the postings in (the unique index still refuses a period charged twice), the
    segments advanced, the balances moved. Killed half way, it is rolled back and the next run rates
    the same segments again: never a double charge, never a lost one."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            _write_postgresql(rated.copy_text, rated.updates)
        else:
            _write_orm(rated.postings, rated.updates, revenue, now)
        _balances_move({account_id: delta for account_id, delta in rated.moved.items() if delta})


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


POSTING_COPY = (
    "COPY billing_posting (created_at, kind, debit_id, credit_id, amount, currency, segment_id, period_start, "
    "seconds, gpu_seconds, detail, memo) FROM STDIN"
)


def _copy_text(postings, revenue: Account, now) -> str:
    """The postings as COPY text, written here rather than row by row through psycopg's adapters:
    every field is a number, a fixed word or an ISO time, and the one free text, the JSON detail, has
    its backslashes doubled (JSON escapes tabs and newlines itself)."""
    head = f"{now.isoformat()}\t{PostingKind.USAGE}\t"
    tail = f"\t{revenue.pk}\t"
    currency = f"\t{revenue.currency}\t"
    periods: dict[datetime, str] = {}
    details: dict[tuple, str] = {}  # one price all period long: the same few details again and again
    rows = []
    for segment_id, debit_id, line, gpu_seconds in postings:
        period = periods.get(line.period_start) or periods.setdefault(line.period_start, line.period_start.isoformat())
        pieces = line.pieces
        key = tuple(pieces[0].items()) if len(pieces) == 1 else None
        detail = details.get(key) if key else None
        if detail is None:
            detail = json.dumps({"pieces": pieces}).replace("\\", "\\\\")
            if key:
                details[key] = detail
        rows.append(
            f"{head}{debit_id}{tail}{line.amount}{currency}{segment_id}\t{period}\t{line.seconds!r}\t"
            f"{float(gpu_seconds)!r}\t{detail}\t\n"
        )
    return "".join(rows)


def _write_postgresql(copy_text: str, updates) -> None:
    """COPY the postings in, then one UPDATE for the segments, which must find every segment the postings
    name: the statement-level reference trigger leaves that check to it (billing migration 0012), for the
    COPY alone (``billing.segments_checked``, on for the transaction, off again after the UPDATE)."""
    if not updates:
        return  # no segment advanced: no posting either
    ids, until, accounts, rates = map(list, zip(*updates, strict=True))
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('billing.segments_checked', 'on', true)")
        with cursor.copy(POSTING_COPY) as copy:
            copy.write(copy_text)
        # "s.id = ANY": the batch's rows found through the primary key; joined to the arrays alone, the
        # planner reads the whole table (a million segments of history) once per batch.
        cursor.execute(
            "UPDATE billing_metersegment s SET settled_until = 'epoch'::timestamptz + v.until * interval '1 us', "
            "account_id = v.account, rate_card_id = v.rate "
            "FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[]) "
            "AS v(id, until, account, rate) WHERE s.id = v.id AND s.id = ANY(%s::bigint[])",
            [int_array(ids), int_array(until), int_array(accounts), int_array(rates), int_array(ids)],
        )
        found = cursor.rowcount
        cursor.execute("SELECT set_config('billing.segments_checked', 'off', true)")
    if found != len(ids):  # the caller's transaction is rolled back: no posting of this batch stays
        raise IntegrityError(f"settlement names {len(ids) - found} meter segment(s) that do not exist")


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
        [MeterSegment(pk=pk, settled_until=moment(us), account_id=a, rate_card_id=r) for pk, us, a, r in updates],
        ["settled_until", "account", "rate_card"],
        batch_size=500,
    )
