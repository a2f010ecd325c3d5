"""Prices and charge lines in plain Python: what a stretch of running costs. No database here.

Rules (README, "Billing"):
- A card-hour price per GPU type; a fraction pays its share (0.3 card pays 0.3 of the
  card-hour price), N cards pay N times. CPU cores and memory beyond the per-card
  allotment (``cpus_per_card`` x share, ``memory_gb_per_card`` x share) pay their own
  small hourly prices; an instance started without a GPU pays ``no_gpu_hour``.
- Spot work pays the spot price in force (before the first one is computed, the top of
  the rate card's published band), on-demand work the rate card's.
- Time is charged per second in clock-hour periods (UTC): one charge line per
  segment and hour. A price that changes inside an hour splits the line's time
  into pieces, each at its own price.
- A run shorter than a minute is charged a minute: the missing seconds go on its
  last line, at the last piece's price.
- **Rounding**: each line's amount is computed exactly in ``Decimal`` and rounded
  once, half up, to the cent. Nothing is rounded before that.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from scheduler.policy.cluster import WHOLE_CARD

CENT = Decimal("0.01")
HOUR = timedelta(hours=1)
MINIMUM_S = 60


@dataclass(frozen=True)
class Shape:
    """What a segment holds while it runs."""

    gpu_model: str
    cards: int
    milli: int  # thousandths of each card
    cpu_cores: int
    memory_mb: int
    spot: bool = False
    no_gpu: bool = False

    @property
    def share(self) -> Decimal:
        return Decimal(self.cards * self.milli) / WHOLE_CARD


@dataclass(frozen=True)
class Rate:
    id: int | None
    effective_from: datetime
    card_hour: Decimal
    cpus_per_card: int = 8
    memory_gb_per_card: int = 32
    cpu_core_hour: Decimal = Decimal("0")
    memory_gb_hour: Decimal = Decimal("0")
    no_gpu_hour: Decimal = Decimal("0")
    spot_ceiling: Decimal = Decimal("0.70")  # x card_hour: spot's price before one was computed


@dataclass
class Timeline:
    """Rates (and spot prices) of one GPU type in time order: which is in force at a moment."""

    rates: list[Rate]
    spot: list[tuple[datetime, Decimal]] = field(default_factory=list)

    def __post_init__(self):
        self.rates.sort(key=lambda r: r.effective_from)
        self.spot.sort()
        self._rate_times = [r.effective_from for r in self.rates]
        self._spot_times = [t for t, _ in self.spot]
        self._changes = {False: self._rate_times, True: sorted(set(self._rate_times) | set(self._spot_times))}

    def rate_at(self, t: datetime) -> Rate:
        i = bisect_right(self._rate_times, t) - 1
        if i < 0:
            raise LookupError(f"no rate card in force at {t.isoformat()}")
        return self.rates[i]

    def spot_at(self, t: datetime, rate: Rate) -> Decimal:
        """The spot price in force; before any was computed, the top of the published band."""
        i = bisect_right(self._spot_times, t) - 1
        return self.spot[i][1] if i >= 0 else rate.card_hour * rate.spot_ceiling

    def changes_between(self, start: datetime, end: datetime, *, spot: bool) -> list[datetime]:
        times = self._changes[spot]
        return times[bisect_right(times, start) : bisect_left(times, end)]


def hourly_price(shape: Shape, rate: Rate, spot_card_hour: Decimal | None = None) -> Decimal:
    """Exact price of one hour of ``shape`` under ``rate`` (not rounded)."""
    if shape.no_gpu:
        return rate.no_gpu_hour
    card = spot_card_hour if shape.spot and spot_card_hour is not None else rate.card_hour
    return _priced(card, _beyond_allotment(shape, rate))


def _priced(card_hour: Decimal, allotment: tuple[Decimal, Decimal, Decimal]) -> Decimal:
    """The hourly price: the share of ``card_hour`` plus what the cores and memory beyond it cost."""
    share, cpu, memory = allotment
    return card_hour * share + cpu + memory


def _beyond_allotment(shape: Shape, rate: Rate) -> tuple[Decimal, Decimal, Decimal]:
    """The shape's share of cards, and what its cores and its memory beyond the cards' allotment cost an hour."""
    share = shape.share
    extra_cpu = max(Decimal(shape.cpu_cores) - rate.cpus_per_card * share, Decimal(0))
    extra_memory = max(Decimal(shape.memory_mb) / 1024 - rate.memory_gb_per_card * share, Decimal(0))
    return share, extra_cpu * rate.cpu_core_hour, extra_memory * rate.memory_gb_hour


def _pricer(shape: Shape, timeline: Timeline) -> Callable[[datetime], tuple[Decimal, Rate]]:
    """``at -> (exact hourly price, rate card)`` for one shape, ``hourly_price`` at ``at``; what depends
    on the rate card alone is worked out once per card (a spot line has a price every few minutes)."""
    parts: dict[int, tuple[Decimal, Decimal, Decimal]] = {}

    def price_at(at: datetime) -> tuple[Decimal, Rate]:
        rate = timeline.rate_at(at)
        if shape.no_gpu:
            return rate.no_gpu_hour, rate
        part = parts.get(id(rate))
        if part is None:
            part = parts[id(rate)] = _beyond_allotment(shape, rate)
        card = timeline.spot_at(at, rate) if shape.spot else rate.card_hour
        return _priced(card, part), rate

    return price_at


def hour_of(t: datetime) -> datetime:
    if t.tzinfo is not UTC:
        t = t.astimezone(UTC)
    return t.replace(minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class Line:
    period_start: datetime
    seconds: float  # billed (includes the minimum's extra seconds)
    amount: Decimal  # rounded once, to the cent
    rate_id: int | None  # in force at the line's first piece
    pieces: list[dict]  # [{"from", "seconds", "hourly"}]


def charge_lines(
    shape: Shape,
    *,
    started_at: datetime,
    ended_at: datetime | None,
    settled_until: datetime | None,
    settle_to: datetime,
    timeline: Timeline,
) -> tuple[list[Line], datetime | None]:
    """Lines for the periods not yet settled, and the new ``settled_until`` (None: nothing to do).

    A closed segment is settled up to its end, with the one-minute minimum on
    its last line. An open one (``ended_at`` None; the caller has checked its
    work is still running at ``settle_to``) is settled for whole hours before
    ``settle_to`` only, and not before it is a minute old — so it will end
    after ``settle_to`` and no minimum can fall on a line already written.
    """
    if ended_at is None:
        if (settle_to - started_at).total_seconds() < MINIMUM_S:
            return [], None
        limit, short_by = hour_of(settle_to), 0.0
    else:
        limit = ended_at
        short_by = max(MINIMUM_S - (ended_at - started_at).total_seconds(), 0.0)
    begin = settled_until or started_at
    if limit <= begin and not (short_by and settled_until is None):
        return [], None
    lines, price_at = [], _pricer(shape, timeline)
    period = hour_of(begin)
    while period < limit:
        lines.append(_line(shape, period, max(begin, period), min(limit, period + HOUR), 0.0, timeline, price_at))
        period += HOUR
    if short_by:  # a closed run under a minute: never settled before, so its lines start at its start
        last = lines.pop() if lines else None
        period = last.period_start if last else hour_of(started_at)
        lines.append(_line(shape, period, max(begin, period), limit, short_by, timeline, price_at))
    return lines, max(limit, begin)


MICROSECONDS_PER_HOUR = Decimal(3_600_000_000)


def _micro(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _line(
    shape: Shape, period: datetime, lo: datetime, hi: datetime, extra_s: float, timeline: Timeline, price_at
) -> Line:
    """One period's line. Its detail lists the pieces only when there is more than one price in it."""
    changes = timeline.changes_between(lo, hi, spot=shape.spot)
    price, first_rate = price_at(lo)
    if not changes:
        exact = price * _micro(hi - lo)
        pieces = [{"hourly": str(price), "rate": first_rate.id}]
    else:
        cuts = [lo, *changes, hi]
        exact, pieces = Decimal(0), []
        for a, b in zip(cuts, cuts[1:], strict=False):
            price, rate = price_at(a)
            exact += price * _micro(b - a)
            pieces.append(
                {"from": a.isoformat(), "seconds": (b - a).total_seconds(), "hourly": str(price), "rate": rate.id}
            )
    if extra_s:
        exact += price * int(extra_s * 1_000_000)
        pieces.append({"minimum_extra_seconds": extra_s, "hourly": str(price)})
    return Line(
        period_start=period,
        seconds=(hi - lo).total_seconds() + extra_s,
        amount=(exact / MICROSECONDS_PER_HOUR).quantize(CENT, rounding=ROUND_HALF_UP),
        rate_id=first_rate.id,
        pieces=pieces,
    )
