"""rows_update: one statement writes each row's own values and the values shared by every row."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduler.models import Workload
from scheduler.services.bulk import rows_update
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
