"""Tables written again and again keep room on their pages, so updates of columns no index covers stay
HOT: the tick's accrual writes on workloads (scheduler migration 0017), settlement's on meter segments
(billing migrations 0011 and 0016)."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from billing.models import MeterSegment
from scheduler.models import Workload
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db
START = datetime(2026, 11, 1, tzinfo=UTC)


def _workloads(owner, n: int) -> list[int]:
    return [workload(owner).pk for _ in range(n)]


def _segments(owner, n: int) -> list[int]:
    return [
        MeterSegment.objects.create(workload=workload(owner), started_at=START, ended_at=START + timedelta(hours=1)).pk
        for _ in range(n)
    ]


TABLES = {
    "scheduler_workload": (
        _workloads,
        lambda ids: Workload.objects.filter(pk__in=ids).update(attained_service=1.0),
        70,
    ),
    "billing_metersegment": (
        _segments,
        lambda ids: MeterSegment.objects.filter(pk__in=ids).update(settled_until=START + timedelta(hours=1)),
        50,
    ),
}


@pytest.mark.parametrize("table", TABLES)
def test_an_update_of_columns_no_index_covers_stays_on_its_page(django_user_model, table):
    create, update, percent = TABLES[table]
    ids = create(django_user_model.objects.create_user("owner"), 300)  # many pages
    some = ids[::4]  # a quarter of each page's rows: their old versions are still visible here
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [table])
        assert cursor.fetchone()[0] == [f"fillfactor={percent}"]
        cursor.execute(f"SELECT ctid FROM {table} WHERE id = ANY(%s) ORDER BY id", [some])
        before = [ctid.split(",")[0] for (ctid,) in cursor.fetchall()]
        update(some)
        cursor.execute(f"SELECT ctid FROM {table} WHERE id = ANY(%s) ORDER BY id", [some])
        after = [ctid.split(",")[0] for (ctid,) in cursor.fetchall()]
    # Each new row version stayed on its row's page (a ctid's first part is the page).
    assert after == before
