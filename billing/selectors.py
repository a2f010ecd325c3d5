"""Reads for money that the console, the admin and the API share."""

from __future__ import annotations

from collections import defaultdict

from django.contrib.auth import get_user_model
from django.db.models import F, Max, Q

from billing.ledger import team_account, user_account
from billing.models import Account, MeterSegment, RateCard, SpotPrice, Team
from billing.rating import Rate, Timeline, rate_of
from core.errors import InvalidInput
from scheduler.models import WorkloadStatus


def payee_wallet(*, username: str = "", team: str = "") -> Account:
    """The wallet a top-up goes to: a user's (by username) or a team's (by slug); exactly one of them."""
    if bool(username) == bool(team):
        raise InvalidInput("give a username or a team, not both", field="username")
    if username:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise InvalidInput("no such user", field="username")
        return user_account(user)
    found = Team.objects.filter(slug=team).first()
    if found is None:
        raise InvalidInput("no such team", field="team")
    return team_account(found)


def timelines(since=None) -> dict[str, Timeline]:
    """Per GPU type (and "" for the default card): its rate cards and spot prices.

    With ``since``, only the spot prices that can be in force from then on (from the earliest of
    those in force at ``since``): a price recomputed every few minutes makes a long history.
    """
    rates: dict[str, list[Rate]] = defaultdict(list)
    for card in RateCard.objects.all():
        rates[card.gpu_model].append(rate_of(card))
    prices = SpotPrice.objects.all()
    if since is not None:
        in_force = SpotPrice.objects.filter(effective_from__lte=since).values("gpu_model")
        in_force = in_force.annotate(t=Max("effective_from")).values_list("t", flat=True)
        prices = prices.filter(effective_from__gte=min(in_force, default=since))
    spots: dict[str, list] = defaultdict(list)
    for model, t, price in prices.values_list("gpu_model", "effective_from", "card_hour"):
        spots[model].append((t, price))
    return {model: Timeline(list(r), spots.get(model, [])) for model, r in rates.items()}


def timeline_for(lines: dict[str, Timeline], gpu_model: str) -> Timeline | None:
    """The GPU type's own rates, else the default card's (None when neither exists)."""
    return lines.get(gpu_model) or lines.get("")


def pending_segments():
    """Segments with time not yet charged: closed ones short of their end, open ones of running work."""
    return MeterSegment.objects.filter(
        Q(ended_at__isnull=False, settled_until__isnull=True)
        | Q(ended_at__isnull=False, settled_until__lt=F("ended_at"))
        | Q(ended_at__isnull=True, workload__status=WorkloadStatus.RUNNING)
    )
