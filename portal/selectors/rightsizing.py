"""Right-sizing (the seed's "请求整卡资源但实际只使用 30%"): the smallest share that would have held an
instance's observed peak, and the money it would have saved this month.

Read from its own minute rollups (``WorkloadGpuMinute``) of the last ``RIGHTSIZING_WINDOW_DAYS``:

- compute: each minute, the sum over its cards of its average utilization of its share times
  the share (a whole card at 25 % is 0.25 of a card; 0.5 of a card fully busy is 0.5); the peak
  is the busiest minute's. A minute's average, not its busiest second: a share's compute is
  throttled, not refused, so a one-second spike on a smaller share only runs a little slower.
- memory: each minute, the sum of its cards' peak memory, as a share of one card's memory; the
  peak is the largest. Memory is a hard cap (a share's memory limit), so this is a true peak.

The need is the larger of the two, plus ``RIGHTSIZING_HEADROOM_PERCENT``; it is rounded up to
the product's sizes (a share on offer, ``SHARE_SIZES``, else whole cards). Nothing is
suggested with fewer than ``RIGHTSIZING_MIN_MINUTES`` minutes measured, or when the need is
not below what it holds.

No advice from an absent reading: a fraction of a card runs under MPS on a real host, where a
tenant's own compute is not measurable (``agent.telemetry.nvml``), so its minutes without a
utilization reading are exactly those its processes ran, the ones that would set its peak.
When a fraction has any such minute in the window, nothing is suggested, and ``Withheld``
says why (advice from the other minutes, or from memory alone, would shrink work that was
busy). A whole card's unread minute is a gap in the samples and is left out, as before.

The saving is what billing's own rules (``billing.rating``: the rate card, spot prices, the
CPU and memory beyond a share's allotment) charge this month's running time as it was, less
what they would charge the same time at the suggested share.

On a host without GPUs (``agent.telemetry.simgpu``) "utilization" is the container's
CPU activity and "GPU memory" its memory, so the suggestion follows what its container did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connection
from django.db.models import Max, Q, Sum
from django.utils import timezone

from billing.enforcement import month_start
from billing.models import MeterSegment, RateCard, SpotPrice
from billing.rating import Shape, Timeline, charge_lines, rate_of, shape_of
from scheduler.models import WorkloadGpuMinute
from scheduler.policy.cluster import WHOLE_CARD, round_up_share

ZERO = Decimal("0.00")
STEP = Decimal("0.1")


@dataclass(frozen=True)
class Peak:
    minutes: int
    compute: float  # cards' worth of compute in the busiest minute
    memory_mb: int  # GPU memory of the fullest minute (all its cards)
    card_memory_mb: int

    @property
    def compute_percent(self) -> int:
        return round(self.compute * 100)


@dataclass(frozen=True)
class Withheld:
    """No advice although minutes were measured: a fraction's compute had no reading in some of them."""

    unread_minutes: int  # minutes of the window without a utilization reading on a shared card
    since: datetime


@dataclass(frozen=True)
class Suggestion:
    gpus: Decimal  # what to ask for: 0.1 .. 0.9 of a card, or whole cards
    holds: Decimal
    peak: Peak
    headroom_percent: int
    since: datetime  # the rollups read start here
    saving: Decimal  # this month, at its rate card
    currency: str

    def as_dict(self) -> dict:
        return {
            "gpus": str(self.gpus.quantize(STEP)),
            "holds": str(self.holds.quantize(STEP)),
            "peak_gpu": round(self.peak.compute, 3),
            "peak_memory_mb": self.peak.memory_mb,
            "minutes": self.peak.minutes,
            "headroom_percent": self.headroom_percent,
            "since": self.since.isoformat(),
            "saving_this_month": str(self.saving),
            "currency": self.currency,
        }


def share_needed(*, compute: float, memory_mb: int, card_memory_mb: int, headroom_percent: int) -> Decimal:
    """The product's smallest size holding this peak with headroom: a share on offer (``SHARE_SIZES``), or
    whole cards."""
    memory = memory_mb / card_memory_mb if card_memory_mb else 0.0
    # Decimal from a rounded float: 0.25 x 1.2 is 0.30000000000000004 in binary, and must stay 0.3.
    need = Decimal(str(round(max(compute, memory) * (100 + headroom_percent) / 100, 6)))
    if need <= 1:
        milli = int((need * WHOLE_CARD).to_integral_value(rounding="ROUND_CEILING"))
        return Decimal(round_up_share(max(milli, 1))) / WHOLE_CARD
    return Decimal(math.ceil(need))


def peak_of(workload, *, since: datetime) -> Peak | None:
    """The busiest minute's compute and memory since ``since`` (None: not one minute measured)."""
    rows = WorkloadGpuMinute.objects.filter(workload=workload, minute__gte=since, util_avg__isnull=False)
    share = workload.gpu_milli / WHOLE_CARD
    per_minute = rows.order_by().values("minute").annotate(u=Sum("util_avg"), m=Sum("mem_max_mb"))
    sql, params = per_minute.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*), MAX(u), MAX(m) FROM ({sql}) AS per_minute", params)
        minutes, util, memory = cursor.fetchone()
    if not minutes:
        return None
    card_memory = rows.aggregate(mb=Max("gpu__memory_mb"))["mb"] or 0
    return Peak(minutes, float(util) * share, int(memory or 0), card_memory)


def saving_this_month(workload, gpus: Decimal, *, now: datetime) -> Decimal:
    """This month's GPU running time charged as it was, less the same time at ``gpus`` cards."""
    start = month_start(now)
    segments = MeterSegment.objects.filter(workload=workload, no_gpu=False, started_at__lt=now).filter(
        Q(ended_at__isnull=True) | Q(ended_at__gt=start)
    )
    segments = list(segments.select_related("workload"))
    timeline = _timeline(workload.gpu_model, start) if segments else None
    if timeline is None:
        return ZERO
    saved = ZERO
    for segment in segments:
        shape = shape_of(segment)
        window = {"started_at": max(segment.started_at, start), "ended_at": min(segment.ended_at or now, now)}
        try:
            saved += _charged(shape, window, timeline) - _charged(_shape_at(shape, gpus), window, timeline)
        except LookupError:  # no rate card in force then: nothing was charged, nothing to save
            continue
    return max(saved, ZERO)


def _timeline(gpu_model: str, start: datetime) -> Timeline | None:
    """``billing.selectors.timeline_for`` for one GPU type, with only the spot prices in force since ``start``."""
    cards = list(RateCard.objects.filter(gpu_model=gpu_model)) or list(RateCard.objects.filter(gpu_model=""))
    if not cards:
        return None
    spot = SpotPrice.objects.filter(gpu_model=gpu_model).values_list("effective_from", "card_hour")
    before = spot.filter(effective_from__lt=start).order_by("-effective_from")[:1]
    return Timeline([rate_of(card) for card in cards], [*before, *spot.filter(effective_from__gte=start)])


def _charged(shape: Shape, window: dict, timeline) -> Decimal:
    end = window["ended_at"]
    lines, _ = charge_lines(shape, **window, settled_until=None, settle_to=end, timeline=timeline)
    return sum((line.amount for line in lines), ZERO)


def _shape_at(shape: Shape, gpus: Decimal) -> Shape:
    if gpus < 1:
        return replace(shape, cards=1, milli=int(gpus * WHOLE_CARD))
    return replace(shape, cards=int(gpus), milli=WHOLE_CARD)


def unread_on_a_shared_card(workload, *, since: datetime) -> int:
    """A fraction's minutes since ``since`` without a utilization reading (0 for whole cards: gaps, not MPS)."""
    if workload.gpu_milli >= WHOLE_CARD:
        return 0
    unread = WorkloadGpuMinute.objects.filter(workload=workload, minute__gte=since, util_avg__isnull=True)
    return unread.values("minute").distinct().count()


def instance_rightsizing(instance, *, now: datetime | None = None) -> Suggestion | None:
    """What the instance should have asked for, or None: too little measured, no reading, or it needs what it
    holds."""
    advice = rightsizing_advice(instance, now=now)
    return advice if isinstance(advice, Suggestion) else None


def rightsizing_advice(instance, *, now: datetime | None = None) -> Suggestion | Withheld | None:
    """``instance_rightsizing``, or ``Withheld`` where the reason there is none is an absent reading."""
    now = now or timezone.now()
    workload = instance.workload
    since = now - timedelta(days=settings.RIGHTSIZING_WINDOW_DAYS)
    unread = unread_on_a_shared_card(workload, since=since)
    if unread:
        return Withheld(unread, since)
    peak = peak_of(workload, since=since)
    if peak is None or peak.minutes < settings.RIGHTSIZING_MIN_MINUTES:
        return None
    headroom = settings.RIGHTSIZING_HEADROOM_PERCENT
    gpus = share_needed(
        compute=peak.compute, memory_mb=peak.memory_mb, card_memory_mb=peak.card_memory_mb, headroom_percent=headroom
    )
    holds = Decimal(workload.gpu_count * workload.gpu_milli) / WHOLE_CARD
    if gpus >= holds:
        return None
    return Suggestion(
        gpus=gpus,
        holds=holds,
        peak=peak,
        headroom_percent=headroom,
        since=since,
        saving=saving_this_month(workload, gpus, now=now),
        currency=instance.gpu_type.currency,
    )
