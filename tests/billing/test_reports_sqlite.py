"""Billing's sums on SQLite (``make run``'s database) print as money, to the cent: the reports, a wallet's
spend this month (the console's header and billing page) and a workload's cost so far (the instance list).

SQLite adds decimals as floats, so a sum of 0.10-CNY charges comes back as 1226.520000000000000 unless it is
rounded. The suite runs on PostgreSQL, so this runs billing in a subprocess on a SQLite file.
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
from billing.enforcement import standing
from billing.ledger import ledger_check, transfer
from billing.models import Account, AccountKind, MeterSegment, PostingKind
from billing.statements import cost_so_far
from tests.scheduler.factories import workload

call_command("migrate", verbosity=0)
user = get_user_model().objects.create_user("sq", password="x")
wallet = Account.objects.get(user=user)
revenue, _ = Account.objects.get_or_create(kind=AccountKind.REVENUE)
start = datetime(2026, 11, 3, tzinfo=UTC)
work = workload(user, status="succeeded")
segment = MeterSegment.objects.create(workload=work, started_at=start, ended_at=start + timedelta(hours=37),
                                      settled_until=start + timedelta(hours=37), account=wallet)
for hour in range(37):
    transfer(
        debit=wallet, credit=revenue, amount=Decimal("33.17") if hour % 2 else Decimal("0.10"), kind=PostingKind.USAGE,
        segment=segment, period_start=start + timedelta(hours=hour), seconds=3600, gpu_seconds=3600,
    )
f = reports.Filters(start=start, end=start + timedelta(days=3))
amounts = [str(row[key]) for table in reports.TABLES.values() for row in table(f)
           for key in ("revenue", "balance") if key in row]
print(json.dumps({"reports": amounts, "month_spend": str(standing(wallet).month_spend),
                  "cost_so_far": str(cost_so_far([work.pk])[work.pk]), "ledger_ok": ledger_check().ok}))
"""


def test_billing_sums_on_sqlite_are_rounded_to_the_cent(tmp_path):
    out = on_sqlite(SCRIPT, tmp_path)
    amounts = [*out["reports"], out["month_spend"], out["cost_so_far"]]
    assert out["reports"], "the reports drew no money rows"
    for amount in amounts:
        assert len(amount.partition(".")[2]) == 2, f"{amount} is not to the cent: {out}"
    assert out["month_spend"] == out["cost_so_far"] == "598.96" and out["ledger_ok"], out
