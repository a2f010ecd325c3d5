"""Monthly statements: one line per instance or job (and one for storage), billed next to busy.

"GPU-seconds billed" are the seconds charged times the cards held; "GPU-seconds
busy" the same cards' measured utilization over the month (from the monitoring
rollups: each minute's average utilization of the share x 60 s x the share),
so a user sees what an idle card cost them. A fraction of a card runs under MPS
on a real host, where its own compute is not measurable (``agent.telemetry.nvml``:
its minutes while a process runs have no reading); a fraction with any such
minute in the month has no busy figure but says so (``busy_unmeasured``),
rather than counting only the minutes it sat idle.

Work submitted together (a job array: a scheduler ``WorkloadGroup``) is billed as a group:
its lines come together, and ``statement_groups`` gives each group its total.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.db.models import Count, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from billing.models import ZERO, Account, Posting, PostingKind
from billing.rating import cents
from scheduler.models import Allocation, WorkloadGpuMinute
from scheduler.policy.cluster import WHOLE_CARD


@dataclass
class StatementLine:
    workload_id: int | None
    name: str
    kind: str
    gpu_model: str
    share: float
    billing_mode: str
    seconds: float
    gpu_seconds_billed: float
    gpu_seconds_busy: float | None
    amount: Decimal
    group_id: int | None = None
    group: str = ""  # the group's name ("array 12: sweep"), empty when the work was submitted alone
    busy_unmeasured: bool = False  # a fraction whose compute had no reading (shared card): busy is None


@dataclass
class StatementGroup:
    """Lines of work submitted together, and their total; a line of its own is a group of one (no name)."""

    group_id: int | None
    name: str
    lines: list[StatementLine]

    @property
    def total(self) -> Decimal:
        return sum((line.amount for line in self.lines), ZERO)


def statement_groups(lines: list[StatementLine]) -> list[StatementGroup]:
    """The statement's lines with each group's lines together (in order of their first line)."""
    groups: list[StatementGroup] = []
    by_id: dict[int, StatementGroup] = {}
    for line in lines:
        if line.group_id is None:
            groups.append(StatementGroup(None, "", [line]))
        elif line.group_id in by_id:
            by_id[line.group_id].lines.append(line)
        else:
            by_id[line.group_id] = StatementGroup(line.group_id, line.group, [line])
            groups.append(by_id[line.group_id])
    return groups


def month_bounds(month: str) -> tuple[datetime, datetime]:
    """'2026-11' -> [2026-11-01, 2026-12-01) in UTC."""
    start = datetime.strptime(month, "%Y-%m").replace(tzinfo=UTC)
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start, end


def statement(account: Account, month: str) -> list[StatementLine]:
    start, end = month_bounds(month)
    charges = Posting.objects.filter(debit=account, created_at__gte=start, created_at__lt=end)
    usage = (
        charges.filter(kind=PostingKind.USAGE)
        .annotate(cards=Coalesce("segment__cards", "segment__workload__gpu_count"))  # an elastic job's runs differ
        .values(
            "segment__workload",
            "segment__workload__name",
            "segment__workload__kind",
            "segment__workload__gpu_model",
            "cards",
            "segment__workload__gpu_milli",
            "segment__spot",
            "segment__workload__group",
            "segment__workload__group__name",
        )
        .annotate(seconds=Sum("seconds"), gpu_seconds=Sum("gpu_seconds"), amount=Sum("amount"), lines=Count("id"))
        .order_by("segment__workload", "segment__spot", "cards")
    )
    busy, unmeasured = _busy_gpu_seconds([row["segment__workload"] for row in usage], start, end)
    lines = [
        StatementLine(
            workload_id=row["segment__workload"],
            name=row["segment__workload__name"],
            kind=row["segment__workload__kind"],
            gpu_model=row["segment__workload__gpu_model"],
            share=row["cards"] * row["segment__workload__gpu_milli"] / WHOLE_CARD,
            billing_mode="spot" if row["segment__spot"] else "on-demand",
            seconds=row["seconds"] or 0.0,
            gpu_seconds_billed=row["gpu_seconds"] or 0.0,
            gpu_seconds_busy=None if row["segment__workload"] in unmeasured else busy.get(row["segment__workload"]),
            amount=cents(row["amount"]),
            group_id=row["segment__workload__group"],
            group=row["segment__workload__group__name"] or "",
            busy_unmeasured=row["segment__workload"] in unmeasured,
        )
        for row in usage
    ]
    lines = [line for group in statement_groups(lines) for line in group.lines]
    storage = charges.filter(kind=PostingKind.STORAGE).aggregate(amount=Sum("amount"), days=Count("id"))
    if storage["days"]:
        lines.append(
            StatementLine(
                None, f"data disks ({storage['days']} days)", "storage", "", 0, "", 0, 0, None, cents(storage["amount"])
            )
        )
    return lines


def _busy_gpu_seconds(workload_ids: list[int], start, end) -> tuple[dict[int, float], set[int]]:
    """(busy GPU-seconds by workload, the fractions with a minute without a reading: their busy time unknown)."""
    shares = {
        (a["workload"], a["gpu"]): a["milli"] / WHOLE_CARD
        for a in Allocation.objects.filter(workload__in=workload_ids).values("workload", "gpu", "milli")
    }
    busy: dict[int, float] = {}
    unmeasured: set[int] = set()
    minutes = WorkloadGpuMinute.objects.filter(workload__in=workload_ids, minute__gte=start, minute__lt=end)
    for workload_id, gpu_id, util, milli in minutes.values_list("workload", "gpu", "util_avg", "workload__gpu_milli"):
        if util is None:  # a fraction's: its process ran on a shared card; a whole card's: a gap in the samples
            if milli < WHOLE_CARD:
                unmeasured.add(workload_id)
            continue
        share = shares.get((workload_id, gpu_id), milli / WHOLE_CARD)  # allocations go when the work stops
        busy[workload_id] = busy.get(workload_id, 0.0) + util * 60 * share
    return busy, unmeasured


BUSY_UNMEASURED = "busy not measurable: per-tenant compute is not measurable on a shared card"
COLUMNS = [
    "name",
    "kind",
    "gpu_model",
    "share",
    "billing_mode",
    "seconds",
    "gpu_seconds_billed",
    "gpu_seconds_busy",
    "amount",
    "group",
]  # then the currency, and a note where busy is not measurable


def statement_csv(lines: list[StatementLine], currency: str) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([*COLUMNS, "currency", "note"])
    for line in lines:
        writer.writerow(
            [
                line.name,
                line.kind,
                line.gpu_model,
                line.share,
                line.billing_mode,
                round(line.seconds),
                round(line.gpu_seconds_billed, 1),
                "" if line.gpu_seconds_busy is None else round(line.gpu_seconds_busy, 1),
                line.amount,
                line.group,
                currency,
                BUSY_UNMEASURED if line.busy_unmeasured else "",
            ]
        )
    writer.writerow(["total", "", "", "", "", "", "", "", sum((ln.amount for ln in lines), ZERO), "", currency, ""])
    return out.getvalue()


def cost_so_far(workload_ids: list[int], now=None) -> dict[int, Decimal]:
    """Per workload: what it has been charged, plus its usage not yet settled."""
    from billing.enforcement import unsettled_by_workload
    from billing.selectors import pending_segments

    charged = dict(
        Posting.objects.filter(kind=PostingKind.USAGE, segment__workload__in=workload_ids)
        .values("segment__workload")
        .annotate(s=Sum("amount"))
        .values_list("segment__workload", "s")
    )
    owed = unsettled_by_workload(pending_segments().filter(workload__in=workload_ids), now or timezone.now())
    for workload_id, amount in owed.items():
        charged[workload_id] = charged.get(workload_id, ZERO) + amount
    return {workload_id: cents(amount) for workload_id, amount in charged.items()}
