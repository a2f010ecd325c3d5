"""Admin billing reports: revenue and GPU-hours by day, GPU type, account and billing mode; capacity use;
spot share; top spenders; negative and low balances. Each is a list of plain rows (dicts) for a date
range, optionally one GPU type and one team, so the page draws it and the CSV export writes it as is.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Count, F, Q, Sum
from django.db.models.functions import TruncDay

from billing.models import ZERO, Account, AccountKind, Posting, PostingKind
from billing.rating import cents
from scheduler.models import Gpu, NodeStatus

LOW_BALANCE = Decimal("10.00")


@dataclass(frozen=True)
class Filters:
    start: datetime
    end: datetime
    gpu_model: str = ""
    team: str = ""


def _charges(f: Filters, kinds: list[str]):
    """Postings of these kinds for time in the range, of one GPU type and one team when asked."""
    postings = Posting.objects.filter(kind__in=kinds, period_start__gte=f.start, period_start__lt=f.end)
    if f.gpu_model:
        postings = postings.filter(segment__workload__gpu_model=f.gpu_model)
    if f.team:
        postings = postings.filter(debit__team__slug=f.team)
    return postings


def _usage(f: Filters):
    return _charges(f, [PostingKind.USAGE])


def _spend(f: Filters):
    return _charges(f, [PostingKind.USAGE, PostingKind.STORAGE])


def _hours(seconds) -> float:
    return round((seconds or 0) / 3600, 2)


def by_day(f: Filters) -> list[dict]:
    revenue = dict(
        _spend(f).annotate(day=TruncDay("period_start")).values("day").annotate(s=Sum("amount")).values_list("day", "s")
    )
    gpu = dict(
        _usage(f)
        .annotate(day=TruncDay("period_start"))
        .values("day")
        .annotate(s=Sum("gpu_seconds"))
        .values_list("day", "s")
    )
    days = sorted(set(revenue) | set(gpu))
    return [
        {"day": d.date().isoformat(), "revenue": cents(revenue.get(d)), "gpu_hours": _hours(gpu.get(d))} for d in days
    ]


def by_gpu_type(f: Filters) -> list[dict]:
    """Revenue, billed GPU-hours and their share of the type's capacity (its cards now x the range's hours)."""
    hours = (f.end - f.start) / timedelta(hours=1)
    cards = dict(
        Gpu.objects.filter(node__status=NodeStatus.ACTIVE)
        .values("model")
        .annotate(n=Count("id"))
        .values_list("model", "n")
    )
    rows = (
        _usage(f)
        .values(model=F("segment__workload__gpu_model"))
        .annotate(revenue=Sum("amount"), gpu_seconds=Sum("gpu_seconds"))
        .order_by("model")
    )
    out = []
    for row in rows:
        capacity = cards.get(row["model"], 0) * hours
        billed = _hours(row["gpu_seconds"])
        out.append(
            {
                "gpu_type": row["model"],
                "revenue": cents(row["revenue"]),
                "gpu_hours": billed,
                "capacity_gpu_hours": round(capacity, 1),
                "utilization": round(billed / capacity, 4) if capacity else None,
            }
        )
    return out


def by_account(f: Filters) -> list[dict]:
    rows = (
        _spend(f)
        .values("debit", "debit__user__username", "debit__team__slug")
        .annotate(revenue=Sum("amount"), gpu_seconds=Sum("gpu_seconds"))
        .order_by("-revenue")
    )
    return [
        {
            "account": row["debit__user__username"] or f"team {row['debit__team__slug']}",
            "revenue": cents(row["revenue"]),
            "gpu_hours": _hours(row["gpu_seconds"]),
        }
        for row in rows
    ]


def by_billing_mode(f: Filters) -> list[dict]:
    rows = _usage(f).values(spot=F("segment__spot")).annotate(revenue=Sum("amount"), s=Sum("gpu_seconds"))
    total = sum((cents(row["revenue"]) for row in rows), ZERO)
    return [
        {
            "billing_mode": "spot" if row["spot"] else "on-demand",
            "revenue": cents(row["revenue"]),
            "gpu_hours": _hours(row["s"]),
            "revenue_share": round(cents(row["revenue"]) / total, 4) if total else None,
        }
        for row in sorted(rows, key=lambda r: r["spot"])
    ]


def top_spenders(f: Filters, n: int = 10) -> list[dict]:
    return by_account(f)[:n]


def balances(f: Filters) -> list[dict]:
    """Wallets at or below LOW_BALANCE, lowest first (negative ones are what settlement overshot)."""
    wallets = Account.objects.filter(kind__in=[AccountKind.USER, AccountKind.TEAM], balance__lte=LOW_BALANCE)
    if f.team:
        wallets = wallets.filter(Q(team__slug=f.team))
    return [
        {
            "account": a.user.username if a.user_id else f"team {a.team.slug}",
            "balance": a.balance,
            "state": "negative" if a.balance < 0 else "low",
            "stopping_since": a.low_balance_since.isoformat() if a.low_balance_since else "",
        }
        for a in wallets.select_related("user", "team").order_by("balance")
    ]


TITLES = {
    "by_day": "Revenue and GPU-hours by day",
    "by_gpu_type": "By GPU type: billed GPU-hours against capacity",
    "by_account": "By account",
    "by_billing_mode": "Spot and on-demand",
    "top_spenders": "Top spenders",
    "balances": "Negative and low balances",
}
TABLES = {
    "by_day": by_day,
    "by_gpu_type": by_gpu_type,
    "by_account": by_account,
    "by_billing_mode": by_billing_mode,
    "top_spenders": top_spenders,
    "balances": balances,
}
