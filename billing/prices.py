"""Prices now: the rate card in force per GPU type, spot prices from cluster load, and estimates.

Spot formula (published, README "Billing"): for each GPU type,

    spot = on-demand x (floor + (ceiling - floor) x load)

where ``load`` is the share of the type's cards (on active nodes) allocated
now, and ``floor`` / ``ceiling`` are the rate card's band (default 0.33 and
0.70: an idle cluster sells spot at a third of on-demand). Recomputed every
``SPOT_PRICE_S``; a new price is recorded only when it moves by a cent or more,
from that moment on (time already run keeps the price it ran at). Prices no longer
in force SPOT_PRICE_RETENTION_DAYS ago, nor when settlement has yet to charge,
are deleted as new ones are recorded (``spot_prune``): the history stays bounded.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.db.models import Count, Min, OuterRef, Subquery, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from billing.models import RateCard, SpotPrice
from billing.rating import CENT, Shape, hourly_price, rate_of
from billing.selectors import pending_segments
from scheduler.models import Gpu, NodeStatus
from scheduler.policy.cluster import WHOLE_CARD

SPOT_PRICE_RETENTION_DAYS = 62  # a month's statements and right-sizing's window look back over them


def rate_card_now(gpu_model: str, at=None) -> RateCard | None:
    at = at or timezone.now()
    cards = RateCard.objects.filter(effective_from__lte=at).order_by("-effective_from")
    return cards.filter(gpu_model=gpu_model).first() or cards.filter(gpu_model="").first()


def spot_now(gpu_model: str, at=None) -> Decimal | None:
    at = at or timezone.now()
    latest = SpotPrice.objects.filter(gpu_model=gpu_model, effective_from__lte=at).order_by("-effective_from").first()
    return latest.card_hour if latest else None


def spot_formula(card: RateCard, load: float) -> Decimal:
    factor = card.spot_floor + (card.spot_ceiling - card.spot_floor) * Decimal(str(round(min(max(load, 0.0), 1.0), 4)))
    return (card.card_hour * factor).quantize(Decimal("0.0001"), rounding=ROUND_HALF_UP)


def spot_recompute(now=None) -> int:
    """Record new spot prices from the cluster's load now; returns how many changed."""
    now = now or timezone.now()
    load = {
        row["model"]: (row["held"] or 0) / (row["cards"] * WHOLE_CARD)
        for row in Gpu.objects.filter(node__status=NodeStatus.ACTIVE)
        .values("model")
        .annotate(cards=Count("id"), held=Sum("allocated_milli"))
    }
    changed = 0
    for model, fraction in load.items():
        card = rate_card_now(model, now)
        if card is None or card.gpu_model != model:
            continue
        price = spot_formula(card, fraction)
        current = spot_now(model, now)
        if current is None or abs(price - current) >= CENT:
            SpotPrice.objects.create(gpu_model=model, effective_from=now, card_hour=price, load=fraction)
            changed += 1
    if changed:
        spot_prune(now)
    return changed


def spot_prune(now=None) -> int:
    """Delete the spot prices that ended before the horizon: SPOT_PRICE_RETENTION_DAYS ago, or the earliest
    time settlement has yet to charge if that is earlier. Each type's price in force at the horizon stays.
    Returns how many went."""
    now = now or timezone.now()
    horizon = now - timedelta(days=SPOT_PRICE_RETENTION_DAYS)
    unsettled = pending_segments().aggregate(t=Min(Coalesce("settled_until", "started_at")))["t"]
    if unsettled is not None:
        horizon = min(horizon, unsettled)
    in_force = SpotPrice.objects.filter(gpu_model=OuterRef("gpu_model"), effective_from__lte=horizon)
    in_force = in_force.order_by("-effective_from").values("effective_from")[:1]
    return SpotPrice.objects.filter(effective_from__lt=Subquery(in_force)).delete()[0]


def estimate(*, gpu_model: str, cards: int, milli: int, cpu_cores: int, memory_mb: int) -> dict | None:
    """Price per hour now of a configuration, on-demand and spot, to show before the user commits."""
    card = rate_card_now(gpu_model)
    if card is None:
        return None
    rate = rate_of(card)
    shape = Shape(gpu_model, cards, milli, cpu_cores, memory_mb)
    spot_card = spot_now(gpu_model) or spot_formula(card, 0.0)
    on_demand = hourly_price(shape, rate)
    spot = hourly_price(Shape(gpu_model, cards, milli, cpu_cores, memory_mb, spot=True), rate, spot_card)
    return {
        "currency": card.currency,
        # Included with each card (as AutoDL allots per card); more is charged per core / GB.
        "cpus_per_card": card.cpus_per_card,
        "memory_gb_per_card": card.memory_gb_per_card,
        "on_demand_per_hour": str(on_demand.quantize(Decimal("0.0001"))),
        "spot_per_hour": str(spot.quantize(Decimal("0.0001"))),
        "spot_card_hour": str(spot_card),
        "spot_band": [
            str((card.card_hour * card.spot_floor).quantize(Decimal("0.0001"))),
            str((card.card_hour * card.spot_ceiling).quantize(Decimal("0.0001"))),
        ],
    }
