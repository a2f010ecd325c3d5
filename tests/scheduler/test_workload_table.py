"""The workload table keeps room on its pages, so the tick's accrual writes stay HOT (migration 0017)."""

import pytest
from django.db import connection

from scheduler.models import Workload
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


def test_an_update_of_columns_no_index_covers_stays_on_its_page(django_user_model):
    owner = django_user_model.objects.create_user("owner")
    rows = [workload(owner) for _ in range(300)]  # many pages
    some = [w.pk for w in rows[::4]]  # a quarter of each page's rows: their old versions are still visible here
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'scheduler_workload'")
        assert cursor.fetchone()[0] == ["fillfactor=70"]
        cursor.execute("SELECT ctid FROM scheduler_workload WHERE id = ANY(%s) ORDER BY id", [some])
        before = [ctid.split(",")[0] for (ctid,) in cursor.fetchall()]
        Workload.objects.filter(pk__in=some).update(attained_service=1.0, gpu_utilization=0.5)
        cursor.execute("SELECT ctid FROM scheduler_workload WHERE id = ANY(%s) ORDER BY id", [some])
        after = [ctid.split(",")[0] for (ctid,) in cursor.fetchall()]
    # Each new row version stayed on its row's page (a ctid's first part is the page).
    assert after == before
