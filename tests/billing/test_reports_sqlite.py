"""The billing reports on SQLite (``make run``'s database): sums print as money, to the cent.

SQLite adds decimals as floats, so a sum of 0.10-CNY charges comes back as 1226.520000000000000 unless the
reports round it. The suite runs on PostgreSQL, so this runs the reports in a subprocess on a SQLite file.
"""

from tests.sqlite import on_sqlite

SCRIPT = """
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import django
django.setup()
from django.contrib.auth import get_user_model
from django.core.management import call_command
from billing import reports
from billing.models import Account, AccountKind, Posting, PostingKind

call_command("migrate", verbosity=0)
user = get_user_model().objects.create_user("sq", password="x")
wallet = Account.objects.get(user=user)
revenue, _ = Account.objects.get_or_create(kind=AccountKind.REVENUE)
start = datetime(2026, 11, 3, tzinfo=UTC)
for hour in range(37):
    Posting.objects.create(
        kind=PostingKind.USAGE, debit=wallet, credit=revenue, amount=Decimal("33.17") if hour % 2 else Decimal("0.10"),
        period_start=start + timedelta(hours=hour), seconds=3600, gpu_seconds=3600,
    )
f = reports.Filters(start=start, end=start + timedelta(days=3))
amounts = [str(row[key]) for table in reports.TABLES.values() for row in table(f)
           for key in ("revenue", "balance") if key in row]
print(json.dumps(amounts))
"""


def test_report_sums_on_sqlite_are_rounded_to_the_cent(tmp_path):
    amounts = on_sqlite(SCRIPT, tmp_path)
    assert amounts, "the reports drew no money rows"
    for amount in amounts:
        assert len(amount.partition(".")[2]) == 2, f"{amount} is not to the cent: {amounts}"
