"""The accounts and segment a posting names must exist: checked per statement on PostgreSQL, not by foreign keys."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, ProgrammingError, connection, transaction

from billing.ledger import platform_account, user_account
from billing.models import AccountKind, MeterSegment, Posting, PostingKind, RateCard
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db
START = datetime(2026, 11, 1, 9, tzinfo=UTC)


@pytest.fixture(autouse=True)
def postgresql_only():
    if connection.vendor != "postgresql":
        pytest.fail("run on PostgreSQL (make test does): the checks are PostgreSQL triggers")


def charge(account, revenue, segment_id, hour, **fields):
    return Posting(
        kind=PostingKind.USAGE,
        debit_id=account.pk,
        credit_id=revenue.pk,
        amount=Decimal("0.10"),
        segment_id=segment_id,
        period_start=START + timedelta(hours=hour),
        **fields,
    )


def test_a_statement_naming_a_missing_segment_is_refused_whole(user):
    account, revenue = user_account(user), platform_account(AccountKind.REVENUE)
    real = MeterSegment.objects.create(workload=workload(user), started_at=START)
    rows = [charge(account, revenue, real.pk, hour) for hour in range(50)] + [
        charge(account, revenue, real.pk + 999, 0)
    ]
    with pytest.raises(IntegrityError, match="meter segment"), transaction.atomic():
        Posting.objects.bulk_create(rows)
    usage = Posting.objects.filter(kind=PostingKind.USAGE)
    assert not usage.exists()
    Posting.objects.bulk_create(rows[:-1])
    assert usage.count() == 50


@pytest.mark.parametrize("side", ["debit_id", "credit_id"])
def test_a_posting_naming_a_missing_account_is_refused(user, side):
    account, revenue = user_account(user), platform_account(AccountKind.REVENUE)
    posting = charge(account, revenue, None, 0)
    setattr(posting, side, revenue.pk + account.pk + 999)
    with pytest.raises(IntegrityError, match="account"), transaction.atomic():
        posting.save()
    assert not Posting.objects.filter(kind=PostingKind.USAGE).exists()


def test_accounts_and_segments_are_never_deleted_nor_renumbered(user):
    account = user_account(user)
    segment = MeterSegment.objects.create(workload=workload(user), started_at=START)
    for sql, row in (
        ("DELETE FROM billing_account WHERE id = %s", account.pk),
        ("DELETE FROM billing_metersegment WHERE id = %s", segment.pk),
        ("UPDATE billing_metersegment SET id = id + 1000 WHERE id = %s", segment.pk),
        ("UPDATE billing_account SET id = id + 1000 WHERE id = %s", account.pk),
    ):
        with pytest.raises(ProgrammingError, match="kept"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [row])
    assert MeterSegment.objects.filter(pk=segment.pk).exists() and type(account).objects.filter(pk=account.pk).exists()


def _settled_batch(account, revenue, segment_ids: list[int]) -> None:
    """What settlement writes for these segments: one posting each, then their UPDATE."""
    from billing.rating import Line
    from billing.settlement import _copy_text, _write_postgresql

    line = Line(START, 60.0, Decimal("0.10"), None, [{"hourly": "6.00", "rate": None}])
    copy_text = _copy_text([(pk, account.pk, line, 60.0) for pk in segment_ids], revenue, START)
    until = int((START + timedelta(hours=1)).timestamp() * 1_000_000)
    rate = RateCard.objects.create(gpu_model="", effective_from=START - timedelta(days=1), card_hour=Decimal(6))
    _write_postgresql(copy_text, [(pk, until, account.pk, rate.pk) for pk in segment_ids])


def test_a_settlement_batch_naming_a_missing_segment_is_refused_whole(user):
    """The trigger leaves settlement's own segments to settlement: its UPDATE must find every one."""
    account, revenue = user_account(user), platform_account(AccountKind.REVENUE)
    real = MeterSegment.objects.create(workload=workload(user), started_at=START)
    with pytest.raises(IntegrityError, match="1 meter segment"), transaction.atomic():
        _settled_batch(account, revenue, [real.pk, real.pk + 999])
    assert not Posting.objects.filter(kind=PostingKind.USAGE).exists()
    real.refresh_from_db()
    assert real.settled_until is None


def test_after_a_settlement_batch_the_trigger_checks_segments_again_in_the_same_transaction(user):
    """A stop settles inside its own transaction: whatever that transaction writes next is checked."""
    account, revenue = user_account(user), platform_account(AccountKind.REVENUE)
    real = MeterSegment.objects.create(workload=workload(user), started_at=START)
    with pytest.raises(IntegrityError, match="meter segment that does not exist"), transaction.atomic():
        _settled_batch(account, revenue, [real.pk])
        Posting.objects.bulk_create([charge(account, revenue, real.pk + 999, 5)])
    assert not Posting.objects.filter(kind=PostingKind.USAGE).exists()
