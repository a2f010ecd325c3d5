"""Prices now: the rate card in force per GPU type, spot prices from cluster load, and estimates.

Spot formula (published, README "Billing"): for each GPU type,

    spot = on-demand x (floor + (ceiling - floor) x load)

where ``load`` is the share of the type's cards (on active nodes) allocated
now, and ``floor`` / ``ceiling`` are the rate card's band (default 0.33 and
0.70: an idle cluster sells spot at a third of on-demand). Recomputed every
``SPOT_PRICE_S``; a new price is recorded only when it moves by a cent or more,
from that moment on (time already run keeps the price it ran at).
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from django.db.models import Count, Sum
from django.utils import timezone

from billing.models import RateCard, SpotPrice
from billing.rating import CENT, Shape, hourly_price
from billing.settlement import rate_of
from scheduler.models import WHOLE_CARD, Gpu, NodeStatus


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
    return changed


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
