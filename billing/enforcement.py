"""Spending limits: what an account may still spend, and stopping its work when it may not.

``standing`` is the account's balance less the usage not yet settled (so the
check does not wait for the hourly settlement), its spend this month and its
budget. ``enforce`` (every ``BILLING_ENFORCE_S``) starts a grace period
(``BILLING_GRACE_S``) when an account's money is gone or its monthly budget is
reached, and stops its running work when the grace ends (jobs get SIGTERM
first, to checkpoint). New work is refused while it lasts (``may_start``). A
team member past their monthly limit has their team work stopped the same
way. The overshoot is at most the grace plus one enforcement period of usage.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db.models import Min, Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from billing.models import ZERO, Account, AccountKind, Membership, Posting, PostingKind
from billing.rating import cents, charge_lines, shape_of
from billing.selectors import pending_segments, timeline_for, timelines
from core.errors import Conflict, PaymentRequired
from scheduler.models import Workload, WorkloadStatus
from scheduler.services.workloads import workload_stop

log = logging.getLogger(__name__)
SPEND_KINDS = [PostingKind.USAGE, PostingKind.STORAGE]
WARN_AT = Decimal("0.8")


@dataclass(frozen=True)
class Standing:
    balance: Decimal
    unsettled: Decimal
    month_spend: Decimal
    budget: Decimal | None
    stop_at: object  # datetime when running work stops, or None

    @property
    def available(self) -> Decimal:
        return self.balance - self.unsettled

    @property
    def exhausted(self) -> bool:
        return self.available <= 0

    @property
    def over_budget(self) -> bool:
        return self.budget is not None and self.month_spend >= self.budget

    @property
    def budget_warning(self) -> bool:
        return self.budget is not None and self.month_spend >= self.budget * WARN_AT


def month_start(now):
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def unsettled(segments, now) -> Decimal:
    """What these segments would be charged if settled now (open ones as if they ended now)."""
    return sum(unsettled_by_workload(segments, now).values(), ZERO)


def unsettled_by_workload(segments, now) -> dict[int, Decimal]:
    """Per workload: what its segments among these would be charged if settled now (with the spot prices
    in force from the earliest time not charged yet only: this runs on every console page)."""
    since = segments.aggregate(t=Min(Coalesce("settled_until", "started_at")))["t"]
    if since is None:
        return {}
    lines_by_model = timelines(since=since)
    owed: dict[int, Decimal] = {}
    for segment in segments.select_related("workload"):
        timeline = timeline_for(lines_by_model, segment.workload.gpu_model)
        if timeline is None:
            continue
        try:
            lines, _ = charge_lines(
                shape_of(segment),
                started_at=segment.started_at,
                ended_at=segment.ended_at or max(now, segment.started_at),
                settled_until=segment.settled_until,
                settle_to=now,
                timeline=timeline,
            )
        except LookupError:
            continue
        owed[segment.workload_id] = owed.get(segment.workload_id, ZERO) + sum((line.amount for line in lines), ZERO)
    return owed


def work_of(account: Account):
    """Workloads charged to this account."""
    if account.kind == AccountKind.TEAM:
        return Workload.objects.filter(team=account.team.slug)
    return Workload.objects.filter(owner_id=account.user_id, team="")


def standing(account: Account, now=None) -> Standing:
    now = now or timezone.now()
    open_segments = pending_segments().filter(
        Q(account=account) | Q(account__isnull=True, workload__in=work_of(account))
    )
    spent = Posting.objects.filter(debit=account, kind__in=SPEND_KINDS, created_at__gte=month_start(now))
    owed = unsettled(open_segments, now)
    stop_at = None
    if account.low_balance_since is not None:
        stop_at = account.low_balance_since + timedelta(seconds=settings.BILLING_GRACE_S)
    return Standing(
        balance=account.balance,
        unsettled=owed,
        month_spend=cents(spent.aggregate(s=Sum("amount"))["s"]) + owed,
        budget=account.monthly_budget,
        stop_at=stop_at,
    )


def may_start(account: Account) -> None:
    """Refuse new or restarted work on an account with no money left or its budget reached."""
    current = standing(account)
    if current.exhausted:
        raise PaymentRequired(
            f"the balance is {current.available} {account.currency}: top up to start work", field="balance"
        )
    if current.over_budget:
        raise PaymentRequired(
            f"this month's budget of {current.budget} {account.currency} is reached: raise it to start work",
            field="budget",
        )


def member_may_start(user, team_slug: str) -> None:
    membership = Membership.objects.filter(user=user, team__slug=team_slug).first()
    if membership is None:
        raise PaymentRequired(f"you are not a member of team {team_slug}", field="team")
    if membership.monthly_limit is not None and member_spend(membership) >= membership.monthly_limit:
        raise PaymentRequired(
            f"your monthly limit of {membership.monthly_limit} on team {team_slug} is reached", field="team"
        )


def member_spend(membership: Membership, now=None) -> Decimal:
    now = now or timezone.now()
    account = membership.team.account
    postings = Posting.objects.filter(
        debit=account,
        kind=PostingKind.USAGE,
        created_at__gte=month_start(now),
        segment__workload__owner=membership.user,
    )
    segments = pending_segments().filter(workload__owner=membership.user, workload__team=membership.team.slug)
    return cents(postings.aggregate(s=Sum("amount"))["s"]) + unsettled(segments, now)


def enforce(now=None) -> list[int]:
    """Start grace periods, stop work whose grace ended; returns the workloads asked to stop."""
    now = now or timezone.now()
    grace = timedelta(seconds=settings.BILLING_GRACE_S)
    running = Workload.objects.filter(status__in=[WorkloadStatus.RUNNING, WorkloadStatus.STARTING])
    stopped = []
    for account in _accounts_with(running):
        current = standing(account, now)
        if not (current.exhausted or current.over_budget):
            if account.low_balance_since is not None:
                Account.objects.filter(pk=account.pk).update(low_balance_since=None)
            continue
        if account.low_balance_since is None:
            Account.objects.filter(pk=account.pk, low_balance_since__isnull=True).update(low_balance_since=now)
            log.warning("account %s: %s; its work stops in %s", account.pk, _why(current), grace)
            continue
        if now - account.low_balance_since >= grace:
            stopped += _stop(work_of(account).filter(pk__in=running), _why(current))
    for membership in Membership.objects.filter(monthly_limit__isnull=False).select_related("team__account", "user"):
        if not hasattr(membership.team, "account"):
            continue
        if member_spend(membership, now) >= membership.monthly_limit:
            theirs = running.filter(owner=membership.user, team=membership.team.slug)
            stopped += _stop(theirs, f"monthly limit of {membership.monthly_limit} on team {membership.team.slug}")
    return stopped


def _accounts_with(running) -> list[Account]:
    users = set(running.filter(team="").values_list("owner_id", flat=True))
    teams = set(running.exclude(team="").values_list("team", flat=True))
    return list(
        Account.objects.filter(
            Q(kind=AccountKind.USER, user_id__in=users) | Q(kind=AccountKind.TEAM, team__slug__in=teams)
        )
    )


def _why(current: Standing) -> str:
    if current.exhausted:
        return f"balance exhausted ({current.available})"
    return f"monthly budget of {current.budget} reached"


def _stop(workloads, why: str) -> list[int]:
    stopped = []
    for workload in workloads:
        try:
            workload_stop(workload, reason=f"stopped: {why}; top up or raise the limit, then start it again")
            stopped.append(workload.pk)
        except Conflict:
            pass  # already stopping
    return stopped
