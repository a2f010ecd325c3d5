"""Settlement: segments become postings exactly once; balances stay the sum of their postings."""

import threading
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest
from celery.exceptions import Retry
from django.db import DatabaseError, connection
from django.utils import timezone

from billing import settlement, tasks
from billing.ledger import ledger_check, user_account, wallet_credit
from billing.models import MeterSegment, Posting, PostingKind, RateCard
from billing.settlement import settle
from core.messages import ToScheduler, send
from scheduler.models import Workload, WorkloadStatus
from tests.conftest import database_url, wait_for, worker_for
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db
START = datetime(2026, 11, 1, 9, 30, tzinfo=UTC)


@pytest.fixture
def rates(db):
    RateCard.objects.create(gpu_model="", effective_from=START - timedelta(days=30), card_hour=Decimal(0))
    return RateCard.objects.create(
        gpu_model="RTX3090", effective_from=START - timedelta(days=30), card_hour=Decimal("1.58")
    )


def segment(owner, *, start=START, seconds=None, milli=1000, status=WorkloadStatus.STOPPED, spot=False):
    w = workload(owner, gpu_milli=milli, status=status, spot=spot)
    end = None if seconds is None else start + timedelta(seconds=seconds)
    return MeterSegment.objects.create(workload=w, started_at=start, ended_at=end, spot=spot)


def usage(account) -> Decimal:
    return sum(
        Posting.objects.filter(debit=account, kind=PostingKind.USAGE).values_list("amount", flat=True), Decimal(0)
    )


def test_settling_twice_charges_once_and_balances_are_sums_of_postings(user, rates):
    segment(user, seconds=2 * 3600, milli=300)  # 09:30 .. 11:30: three lines
    segment(user, start=START + timedelta(days=1), seconds=59)  # a minute's minimum
    account = user_account(user)
    before = account.balance
    first = settle(now=START + timedelta(days=2))
    again = settle(now=START + timedelta(days=2))
    assert (first.postings, again.postings) == (4, 0)
    # 0.3 x 1.58 x 2 h = 0.948 as lines 0.237 + 0.474 + 0.237 -> 0.24 + 0.47 + 0.24; a minute of 1.58/h = 0.03
    assert usage(account) == Decimal("0.95") + Decimal("0.03")
    account.refresh_from_db()
    assert account.balance == before - Decimal("0.98")
    assert ledger_check().ok


def test_a_running_segment_is_charged_hourly_then_to_its_end(user, rates):
    seg = segment(user, seconds=None, status=WorkloadStatus.RUNNING)
    settle(now=START + timedelta(hours=2, minutes=10))  # 09:30 .. 11:00 charged; the running hour is not
    seg.refresh_from_db()
    assert seg.settled_until == START + timedelta(minutes=30, hours=1)
    assert seg.rate_card_id is not None and seg.account.user == user, "the payer and the rate are recorded"
    MeterSegment.objects.filter(pk=seg.pk).update(ended_at=START + timedelta(hours=2, minutes=40))
    Workload.objects.filter(pk=seg.workload_id).update(status=WorkloadStatus.STOPPED)
    settle(now=START + timedelta(hours=3))
    lines = Posting.objects.filter(segment=seg).order_by("period_start")
    assert [(p.period_start.hour, p.seconds, p.amount) for p in lines] == [
        (9, 1800, Decimal("0.79")),
        (10, 3600, Decimal("1.58")),
        (11, 3600, Decimal("1.58")),
        (12, 600, Decimal("0.26")),  # 09:30 .. 12:10 in four lines, the last at its end
    ]


def test_an_open_segment_of_work_that_left_running_waits_for_its_end(user, rates):
    seg = segment(user, seconds=None, status=WorkloadStatus.STOPPING)
    assert settle(now=START + timedelta(hours=5)).postings == 0
    seg.refresh_from_db()
    assert seg.settled_until is None


def test_postings_cannot_be_changed_or_deleted(user, rates):
    segment(user, seconds=600)
    settle(now=START + timedelta(days=1))
    posting = Posting.objects.get(kind=PostingKind.USAGE)
    if connection.vendor != "postgresql":
        pytest.fail("run on PostgreSQL (make test does): the append-only trigger is PostgreSQL's")
    from django.db import ProgrammingError, transaction

    for change in (lambda: Posting.objects.filter(pk=posting.pk).update(amount=0), posting.delete):
        with pytest.raises(ProgrammingError, match="append-only"), transaction.atomic():
            change()


@pytest.mark.django_db(transaction=True)
def test_settlement_racing_a_stop_and_top_ups_keeps_every_balance_the_sum_of_its_postings(user, rates):
    if connection.vendor != "postgresql":
        pytest.fail("run on PostgreSQL (make test does)")
    segments = [segment(user, start=START + timedelta(minutes=i), seconds=3 * 3600 + i) for i in range(200)]
    running = segment(user, seconds=None, status=WorkloadStatus.RUNNING)
    account = user_account(user)
    errors = []

    def guarded(fn):
        def run():
            try:
                fn()
            except Exception as exc:  # collected: a thread's failure must fail the test
                errors.append(exc)
            finally:
                connection.close()

        return run

    def stop():
        MeterSegment.objects.filter(pk=running.pk).update(ended_at=START + timedelta(hours=1, minutes=5))
        Workload.objects.filter(pk=running.workload_id).update(status=WorkloadStatus.STOPPED)

    def top_up(i):
        return lambda: wallet_credit(
            account=account, amount=Decimal("10"), kind="topup", memo="race", by=None, idempotency_key=f"race-{i % 3}"
        )

    threads = [
        threading.Thread(target=guarded(lambda: settle(now=START + timedelta(days=1), batch=37))) for _ in range(3)
    ]
    threads += [threading.Thread(target=guarded(stop))]
    threads += [threading.Thread(target=guarded(top_up(i))) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    settle(now=START + timedelta(days=1))
    assert ledger_check().ok
    charged = Posting.objects.filter(kind=PostingKind.USAGE)
    assert charged.count() == charged.values("segment", "period_start").distinct().count()
    assert set(charged.values_list("segment", flat=True).distinct()) == {s.pk for s in segments} | {running.pk}
    assert Posting.objects.filter(kind="topup").count() == 3, "the same Idempotency-Key is one top-up"


def test_the_payer_and_the_rate_are_recorded_when_a_segment_opens(user, rates):
    from billing.settlement import segment_assign

    seg = segment(user, start=timezone.now() - timedelta(minutes=1), seconds=None, status=WorkloadStatus.RUNNING)
    assert segment_assign(seg.workload_id) == 1
    seg.refresh_from_db()
    assert (seg.account, seg.rate_card) == (user_account(user), rates)
    assert segment_assign(seg.workload_id) == 0, "recorded once"


def _second_write_fails(monkeypatch) -> None:
    """The run's second batch fails to write (the first is written as usual)."""
    real_write, writes = settlement._write_batch, []

    def second_write_fails(*args, **kwargs):
        writes.append(args)
        if len(writes) == 2:
            raise DatabaseError("the database went away")
        return real_write(*args, **kwargs)

    monkeypatch.setattr(settlement, "_write_batch", second_write_fails)


def _settlers_locks(*, here_only: bool = False) -> int:
    """How many sessions hold the settlers' advisory lock (or whether this test's connection does)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND ((classid::bigint << 32) | objid::bigint) = %s" + (" AND pid = pg_backend_pid()" if here_only else ""),
            [settlement.SETTLEMENT_LOCK],
        )
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_a_settlement_that_fails_half_way_frees_the_settlers_lock_and_the_next_one_charges_the_rest(
    user, rates, monkeypatch
):
    if connection.vendor != "postgresql":
        pytest.fail("run on PostgreSQL (make test does)")
    segments = [segment(user, start=START + timedelta(minutes=i), seconds=600) for i in range(4)]
    _second_write_fails(monkeypatch)
    with pytest.raises(DatabaseError):
        settle(now=START + timedelta(days=1), batch=1)
    assert _settlers_locks() == 0, "a failed settlement left the lock held: every later settler would wait"
    assert Posting.objects.filter(kind=PostingKind.USAGE).count() == 1, "the first batch was committed"

    monkeypatch.undo()
    settle(now=START + timedelta(days=1), batch=1)
    charged = Posting.objects.filter(kind=PostingKind.USAGE)
    assert sorted(charged.values_list("segment", flat=True)) == sorted(s.pk for s in segments)
    assert ledger_check().ok


@contextmanager
def settlers_lock_held_elsewhere():
    """The settlers' lock held by another backend, as a running settlement holds it. A settler here that waited
    for it would fail after 10 s (``lock_timeout``) instead of hanging the test."""
    with psycopg.connect(database_url(), autocommit=True) as other, connection.cursor() as cursor:
        other.execute("SELECT pg_advisory_lock(%s)", [settlement.SETTLEMENT_LOCK])
        cursor.execute("SET lock_timeout = '10s'")
        try:
            yield
        finally:
            cursor.execute("RESET lock_timeout")
            other.execute("SELECT pg_advisory_unlock(%s)", [settlement.SETTLEMENT_LOCK])


@pytest.mark.django_db(transaction=True)
def test_a_settler_that_may_not_wait_says_the_lock_is_taken_and_settles_nothing_until_it_is_free(user, rates):
    if connection.vendor != "postgresql":
        pytest.fail("run on PostgreSQL (make test does)")
    seg = segment(user, seconds=600)
    with settlers_lock_held_elsewhere():
        with pytest.raises(settlement.SettlerBusy):
            settle(now=START + timedelta(days=1), segment_ids=[seg.pk], wait=False)
        assert not Posting.objects.filter(kind=PostingKind.USAGE).exists()
        assert not _settlers_locks(here_only=True)
    assert settle(now=START + timedelta(days=1), segment_ids=[seg.pk], wait=False).postings == 1
    assert not _settlers_locks(here_only=True)  # released at the end, as the waiting settler's is
    assert ledger_check().ok


@pytest.mark.django_db(transaction=True)
def test_the_settlement_task_comes_back_later_instead_of_holding_a_scheduler_thread_while_another_settles(
    user, rates, monkeypatch
):
    """At a stop the task settles that work's segments; during the hourly run (minutes on a large ledger) it would
    wait on the lock with one of the scheduler worker's two threads. It asks to be run again instead, with its own
    arguments only (not the request's, which may name the host that signed it: core.signing)."""
    if connection.vendor != "postgresql":
        pytest.fail("run on PostgreSQL (make test does)")
    seg = segment(user, seconds=600)
    asked = []

    def retry(**kwargs):
        asked.append(kwargs)
        return Retry("again later")

    monkeypatch.setattr(tasks.settle_usage, "retry", retry)
    with settlers_lock_held_elsewhere():
        with pytest.raises(Retry):
            tasks.settle_usage(seg.workload_id)
    [again] = asked
    assert isinstance(again.pop("exc"), settlement.SettlerBusy)
    assert again == {"args": (), "kwargs": {"workload_id": seg.workload_id}, "countdown": 5}
    assert not Posting.objects.filter(kind=PostingKind.USAGE).exists()

    tasks.settle_usage(seg.workload_id)  # the lock is free: it settles
    assert Posting.objects.filter(kind=PostingKind.USAGE, segment=seg).count() == 1
    assert len(asked) == 1


def test_a_settlement_that_keeps_finding_the_lock_taken_comes_back_less_often_up_to_a_minute():
    assert [tasks.busy_retry_in(n) for n in range(7)] == [5, 10, 20, 40, 60, 60, 60]
    assert tasks.busy_retry_in(10_000) == 60


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_keeps_its_threads_while_the_settlers_lock_is_taken_and_settles_once_it_is_free(
    user, rates, monkeypatch
):
    """Three stops' settlements sent to a real scheduler worker (two threads) while another settlement holds the
    lock: all three come back later (a thread waiting on the lock would run no other task, the tick's included),
    and each settles once the lock is free — through Celery's retry, signed as any message the worker sends."""
    from celery.signals import task_retry

    if connection.vendor != "postgresql":
        pytest.fail("run on PostgreSQL (make test does)")
    segments = [segment(user, start=START + timedelta(minutes=i), seconds=600) for i in range(3)]
    retried: dict[str, str] = {}
    monkeypatch.setattr(tasks, "SETTLER_BUSY_RETRY_S", 1)
    monkeypatch.setattr(tasks, "SETTLER_BUSY_RETRY_MAX_S", 1)

    def seen(request, reason, **kwargs):
        retried[request.id] = type(reason.exc).__name__  # reason: the Retry, for the exception it was given

    task_retry.connect(seen, weak=False)
    try:
        with worker_for():
            with settlers_lock_held_elsewhere():
                for seg in segments:
                    send(ToScheduler.SETTLE_USAGE, seg.workload_id)
                wait_for(lambda: len(retried) == 3, timeout=30, what="each settlement to come back later")
                assert set(retried.values()) == {"SettlerBusy"}
                assert not Posting.objects.filter(kind=PostingKind.USAGE).exists()
            wait_for(
                lambda: Posting.objects.filter(kind=PostingKind.USAGE).count() == 3,
                timeout=30,
                what="the three settlements once the lock is free",
            )
    finally:
        task_retry.disconnect(seen)
    charged = Posting.objects.filter(kind=PostingKind.USAGE).values_list("segment", flat=True)
    assert sorted(charged) == sorted(s.pk for s in segments)
    assert ledger_check().ok


def test_settling_runs_with_the_garbage_collector_paused_and_turns_it_back_on(user, rates, monkeypatch):
    """Rating and writing a run's batches pile up lines and postings that look long-lived to the collector;
    its full collections hold the GIL the writing thread needs (1 s of a 5 s bench run): paused for the run."""
    import gc

    seen = []
    rate_batch = settlement._rate_batch
    monkeypatch.setattr(settlement, "_rate_batch", lambda *a, **kw: seen.append(gc.isenabled()) or rate_batch(*a, **kw))
    segment(user, seconds=600)
    assert gc.isenabled()

    assert settle(now=START + timedelta(days=1)).postings == 1

    assert seen and not any(seen) and gc.isenabled()


def test_a_stretch_run_without_a_card_is_charged_its_own_price_and_counts_no_gpu_seconds(user, rates):
    """No-GPU mode (AutoDL's 无卡模式): the work keeps its shape, holds no card and pays ``no_gpu_hour``; its
    postings say 0 GPU-seconds, so statements and the per-GPU-hour reports count no card it did not hold."""
    rates.no_gpu_hour = Decimal("0.10")
    rates.save()
    with_card = segment(user, seconds=1800, milli=500)
    without = segment(user, start=START + timedelta(hours=1), seconds=1800, milli=500)
    MeterSegment.objects.filter(pk=without.pk).update(no_gpu=True)

    settle(now=START + timedelta(days=1))

    by_segment = {p.segment_id: p for p in Posting.objects.filter(kind=PostingKind.USAGE)}
    assert (by_segment[with_card.pk].gpu_seconds, by_segment[with_card.pk].amount) == (900, Decimal("0.40"))
    assert (by_segment[without.pk].gpu_seconds, by_segment[without.pk].amount) == (0, Decimal("0.05"))


def _readers(monkeypatch) -> list[tuple[str, object]]:
    """Which thread read each batch, and on which connection."""
    from django.db import connections

    seen = []
    pending_batches = settlement._pending_batches

    def recording(*args):
        for rows in pending_batches(*args):
            seen.append((threading.current_thread().name, connections["default"]))
            yield rows

    monkeypatch.setattr(settlement, "_pending_batches", recording)
    return seen


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_the_rating_thread_reads_its_batches_on_its_own_connection_and_closes_it(
    user, rates, monkeypatch
):
    """Reading overlaps writing (the settling thread only writes); the rating thread's connection does not
    outlive the run."""
    from django.db import connections

    readers = _readers(monkeypatch)
    for hour in range(3):
        segment(user, start=START + timedelta(hours=hour), seconds=600)

    done = settle(now=START + timedelta(days=1), batch=1)

    assert (done.segments, done.postings) == (3, 3) and ledger_check().ok
    assert len(readers) == 3 and all(name.startswith("settle-rating") for name, _ in readers)
    [apart] = {id(reader): reader for _, reader in readers}.values()
    assert apart is not connections["default"] and apart.connection is None  # closed when the run ended


@pytest.mark.django_db(transaction=True)
def test_inside_a_callers_transaction_the_batches_are_read_on_its_connection_which_sees_its_rows(
    user, rates, monkeypatch
):
    """A stop that closes a segment and settles it in one transaction: only that transaction's connection
    sees the segment; read anywhere else, it would be left unsettled."""
    from django.db import transaction

    readers = _readers(monkeypatch)
    with transaction.atomic():
        segment(user, seconds=600)
        done = settle(now=START + timedelta(days=1))

    assert (done.segments, done.postings) == (1, 1)
    assert [name for name, _ in readers] == [threading.current_thread().name]


@pytest.mark.django_db(transaction=True)
def test_a_run_that_fails_half_way_closes_its_rating_threads_connection_too(user, rates, monkeypatch):
    readers = _readers(monkeypatch)
    for i in range(4):
        segment(user, start=START + timedelta(minutes=i), seconds=600)
    _second_write_fails(monkeypatch)
    with pytest.raises(DatabaseError):
        settle(now=START + timedelta(days=1), batch=1)

    [apart] = {id(reader): reader for _, reader in readers}.values()
    assert [name.startswith("settle-rating") for name, _ in readers] == [True] * len(readers)
    assert apart.connection is None, "a failed run left its rating thread's connection open"


def test_a_segment_pending_only_after_the_prices_were_read_and_from_before_them_waits_for_the_next_run(
    user, rates, monkeypatch
):
    """A run reads the prices from the earliest pending time on, then the segments: one whose end was
    recorded in between, from before that time, would be rated without its prices. It is left pending."""
    later = segment(user, seconds=600)
    earlier = segment(user, start=START - timedelta(hours=2), status=WorkloadStatus.STOPPING)  # open, not pending
    read_prices = settlement.timelines

    def end_recorded_meanwhile(*args, **kwargs):
        prices = read_prices(*args, **kwargs)
        MeterSegment.objects.filter(pk=earlier.pk).update(ended_at=START - timedelta(hours=1))
        return prices

    monkeypatch.setattr(settlement, "timelines", end_recorded_meanwhile)
    assert settle(now=START + timedelta(days=1)).segments == 1
    assert list(Posting.objects.filter(kind=PostingKind.USAGE).values_list("segment", flat=True)) == [later.pk]

    monkeypatch.undo()
    assert settle(now=START + timedelta(days=1)).segments == 1
    charged = Posting.objects.filter(segment=earlier).values_list("amount", flat=True)
    assert sum(charged) == Decimal("1.58") and ledger_check().ok  # an hour, at its own price
