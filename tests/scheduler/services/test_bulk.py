"""rows_update: one statement writes each row's own values and the values shared by every row; rows_insert: one
statement inserts many rows, each column not named taking its database or Django default."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduler.models import Allocation, Workload, WorkloadEvent
from scheduler.services.bulk import rows_insert, rows_update
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


def test_it_writes_each_rows_values_and_the_shared_ones_in_one_statement():
    owner = get_user_model().objects.create_user("owner")
    first, second, untouched = (workload(owner) for _ in range(3))
    first.attained_service, second.attained_service = 1.5, 2.5
    first.queue_level, second.queue_level = 1, 2
    when = timezone.now() - timedelta(minutes=3)
    with CaptureQueriesContext(connection) as queries:
        rows_update(Workload, [first, second], ["attained_service", "queue_level"], accrued_at=when)
    assert len(queries) == 1
    rows = dict(Workload.objects.values_list("pk", "attained_service"))
    assert (rows[first.pk], rows[second.pk], rows[untouched.pk]) == (1.5, 2.5, 0.0)
    assert list(Workload.objects.order_by("pk").values_list("queue_level", flat=True)) == [1, 2, 0]
    accrued = dict(Workload.objects.values_list("pk", "accrued_at"))
    assert accrued[first.pk] == accrued[second.pk] == when and accrued[untouched.pk] is None


def test_a_shared_value_can_be_an_expression_the_database_works_out():
    owner = get_user_model().objects.create_user("owner")
    first, second = workload(owner), workload(owner)
    first.queue_level, second.queue_level = 1, 2
    with transaction.atomic():
        rows_update(Workload, [first, second], ["queue_level"], status_changed_at=Now(), status_reason="placed")
        with connection.cursor() as cursor:
            cursor.execute("SELECT STATEMENT_TIMESTAMP()")
            (later,) = cursor.fetchone()
    rows = list(Workload.objects.order_by("pk").values_list("queue_level", "status_reason", "status_changed_at"))
    assert [row[:2] for row in rows] == [(1, "placed"), (2, "placed")]
    # The database's time, one for every row, no later than the next statement's.
    first_at, second_at = (row[2] for row in rows)
    assert first_at is not None and first_at == second_at and first_at <= later


def test_nothing_to_write_is_no_statement():
    with CaptureQueriesContext(connection) as queries:
        rows_update(Workload, [], ["attained_service"])
    assert len(queries) == 0


def test_added_fields_add_to_the_rows_value_so_a_write_made_since_the_read_is_kept():
    owner = get_user_model().objects.create_user("owner")
    first, second = workload(owner), workload(owner)
    Workload.objects.filter(pk=first.pk).update(attained_service=100.0)  # after ``first`` was read
    first.attained_service, second.attained_service = 1.5, 2.5  # what to add
    first.queue_level = second.queue_level = 2
    with CaptureQueriesContext(connection) as queries:
        rows_update(Workload, [first, second], ["queue_level"], add=("attained_service",))
    assert len(queries) == 1
    rows = dict(Workload.objects.values_list("pk", "attained_service"))
    assert (rows[first.pk], rows[second.pk]) == (101.5, 2.5)
    assert list(Workload.objects.order_by("pk").values_list("queue_level", flat=True)) == [2, 2]


def test_rows_insert_writes_every_row_in_one_statement_with_the_defaults_of_the_columns_not_named():
    owner = get_user_model().objects.create_user("owner")
    first, second = workload(owner), workload(owner)
    card_a, card_b = make_node("sim:2xRTX3090").gpus.order_by("index")
    before = timezone.now()
    with CaptureQueriesContext(connection) as queries:
        at = rows_insert(
            WorkloadEvent,
            ["workload_id", "from_status", "to_status", "reason"],
            [(first.pk, "queued", "starting", "placed on a"), (second.pk, "queued", "starting", "placed on b")],
            returning="created_at",
        )
        rows_insert(
            Allocation,
            ["workload_id", "gpu_id", "milli", "memory_mb"],
            [(first.pk, card_a.pk, 500, 0), (second.pk, card_b.pk, 1000, 7)],
        )
    assert len(queries) == 2
    events = list(
        WorkloadEvent.objects.order_by("workload_id").values_list(
            "workload_id", "to_status", "reason", "meter", "created_at"
        )
    )
    # The database's time (its default), one for the statement, as returned; the meter's database default.
    assert events == [(first.pk, "starting", "placed on a", "", at), (second.pk, "starting", "placed on b", "", at)]
    shares = list(
        Allocation.objects.order_by("workload_id").values_list(
            "workload_id", "gpu_id", "milli", "memory_mb", "created_at"
        )
    )
    assert [share[:4] for share in shares] == [(first.pk, card_a.pk, 500, 0), (second.pk, card_b.pk, 1000, 7)]
    assert all(share[4] >= before for share in shares)  # auto_now_add: Django's default, given here


def test_rows_insert_of_nothing_is_no_statement():
    with CaptureQueriesContext(connection) as queries:
        assert rows_insert(WorkloadEvent, ["workload_id"], [], returning="created_at") is None
    assert len(queries) == 0


def test_numbers_times_and_empty_values_sent_as_array_literals_arrive_exactly():
    owner = get_user_model().objects.create_user("owner")
    rows = [workload(owner) for _ in range(3)]
    when = timezone.now() - timedelta(microseconds=123457)
    values = [(0.1 + 0.2, 7, when), (1e-300, 32767, None), (float("inf"), 0, when + timedelta(days=400))]
    for w, (service, level, accrued) in zip(rows, values, strict=True):
        w.attained_service, w.queue_level, w.accrued_at = service, level, accrued
    rows_update(Workload, rows, ["attained_service", "queue_level", "accrued_at"])
    got = Workload.objects.filter(pk__in=[w.pk for w in rows]).order_by("pk")
    assert list(got.values_list("attained_service", "queue_level", "accrued_at")) == values


def test_only_rows_still_at_the_version_read_are_written_and_their_new_versions_come_back():
    owner = get_user_model().objects.create_user("owner")
    first, second = workload(owner), workload(owner)
    version = "scheduler_workload.xmin::text || scheduler_workload.ctid::text"
    read = dict(Workload.objects.annotate(version=RawSQL(version, ())).values_list("pk", "version"))
    first.version, second.version = read[first.pk], read[second.pk]
    Workload.objects.filter(pk=second.pk).update(gpu_utilization=0.5)  # written since the read
    first.queue_level = second.queue_level = 3
    written = rows_update(Workload, [first, second], ["queue_level"], version=version, returning={"v": version})
    now = dict(Workload.objects.annotate(version=RawSQL(version, ())).values_list("pk", "version"))
    assert written == [(first.pk, now[first.pk])] and now[first.pk] != read[first.pk]
    assert dict(Workload.objects.values_list("pk", "queue_level")) == {first.pk: 3, second.pk: 0}
