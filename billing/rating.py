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
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from functools import lru_cache

from scheduler.policy.cluster import WHOLE_CARD

CENT = Decimal("0.01")


def cents(amount) -> Decimal:
    """An amount, or a database's sum of amounts (None: nothing), to the cent. SQLite adds decimals as
    floats: its sum of 0.28 and 0.01 and 0.01 comes back as 0.300000000000000."""
    return (amount or Decimal(0)).quantize(CENT)


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
        changes = {False: self._rate_times, True: sorted(set(self._rate_times) | set(self._spot_times))}
        # Every moment a price can change, as microseconds since the epoch: on-demand work's, spot work's.
        self._changes_us = {spot: [micros(t) for t in times] for spot, times in changes.items()}
        self._stretches: dict[bool, dict[int, tuple[Rate, Decimal]]] = {False: {}, True: {}}

    def rate_at(self, t: datetime) -> Rate:
        i = bisect_right(self._rate_times, t) - 1
        if i < 0:
            raise LookupError(f"no rate card in force at {t.isoformat()}")
        return self.rates[i]

    def spot_at(self, t: datetime, rate: Rate) -> Decimal:
        """The spot price in force; before any was computed, the top of the published band."""
        i = bisect_right(self._spot_times, t) - 1
        return self.spot[i][1] if i >= 0 else rate.card_hour * rate.spot_ceiling

    def stretch(self, spot: bool, i: int, us: int) -> tuple[Rate, Decimal]:
        """The rate card and card-hour price in force in stretch ``i`` between ``spot`` (or on-demand) work's
        price changes, ``us`` a moment in it; looked up once per stretch. LookupError before the first card."""
        known = self._stretches[spot].get(i)
        if known is None:
            t = moment(us)
            rate = self.rate_at(t)
            known = self._stretches[spot][i] = (rate, self.spot_at(t, rate) if spot else rate.card_hour)
        return known


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


# Rating works on times as integer microseconds since the epoch (UTC): exact, and cheap to compare,
# subtract and cut into hours, where a datetime costs an object and a time-zone lookup each time.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)
US = 1_000_000  # per second
HOUR_US = 3600 * US


def micros(t: datetime) -> int:
    """An aware time as microseconds since the epoch."""
    return (t - EPOCH) // MICROSECOND


def moment(us: int) -> datetime:
    """Microseconds since the epoch as a UTC time."""
    return EPOCH + timedelta(microseconds=us)


@lru_cache(maxsize=16384)
def _hour_or_change(us: int) -> tuple[datetime, str]:
    """An hour's start or a price change (few, seen again and again) as a time and its ISO text."""
    t = moment(us)
    return t, t.isoformat()


class Pricer:
    """One shape's prices on one timeline. Between two price changes the price is one, so it is worked out
    once per stretch (``at``), with the text a line's detail shows; what depends on the rate card alone
    (share, cores and memory beyond the allotment) once per card."""

    def __init__(self, shape: Shape, timeline: Timeline):
        self.shape, self.timeline = shape, timeline
        self.changes = timeline._changes_us[shape.spot]  # the stretches' bounds
        self._stretches: dict[int, tuple] = {}
        self._parts: dict[int, tuple[Decimal, Decimal, Decimal]] = {}

    def at(self, us: int, i: int | None = None) -> tuple[int, Decimal, Rate, str, list[dict]]:
        """The stretch ``us`` falls in (``i`` when known) and its exact hourly price, rate card, price as
        text and one-piece detail. Raises LookupError before the first rate card."""
        if i is None:
            i = bisect_right(self.changes, us)
        stretch = self._stretches.get(i)
        if stretch is None:
            rate, card = self.timeline.stretch(self.shape.spot, i, us)
            price = self._price(rate, card)
            hourly = str(price)
            stretch = self._stretches[i] = (i, price, rate, hourly, [{"hourly": hourly, "rate": rate.id}])
        return stretch

    def _price(self, rate: Rate, card_hour: Decimal) -> Decimal:
        """``hourly_price`` under ``rate`` with ``card_hour`` the card's price."""
        if self.shape.no_gpu:
            return rate.no_gpu_hour
        part = self._parts.get(id(rate))
        if part is None:
            part = self._parts[id(rate)] = _beyond_allotment(self.shape, rate)
        return _priced(card_hour, part)


@dataclass(frozen=True, slots=True)
class Line:
    period_start: datetime
    seconds: float  # billed (includes the minimum's extra seconds)
    amount: Decimal  # rounded once, to the cent
    rate_id: int | None  # in force at the line's first piece
    pieces: list[dict]  # [{"from", "seconds", "hourly"}]; shared by lines of one price: read, never change


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

    ``lines_between`` on aware times."""
    lines, until = lines_between(
        Pricer(shape, timeline),
        started=micros(started_at),
        ended=None if ended_at is None else micros(ended_at),
        settled=None if settled_until is None else micros(settled_until),
        settle_to=micros(settle_to),
    )
    return lines, None if until is None else moment(until)


def lines_between(
    pricer: Pricer, *, started: int, ended: int | None, settled: int | None, settle_to: int
) -> tuple[list[Line], int | None]:
    """Lines for the periods not yet settled, and the new settled-until (None: nothing to do); times as
    microseconds since the epoch.

    A closed segment is settled up to its end, with the one-minute minimum on
    its last line. An open one (``ended`` None; the caller has checked its
    work is still running at ``settle_to``) is settled for whole hours before
    ``settle_to`` only, and not before it is a minute old — so it will end
    after ``settle_to`` and no minimum can fall on a line already written.
    """
    if ended is None:
        if settle_to - started < MINIMUM_S * US:
            return [], None
        limit, short_by = settle_to - settle_to % HOUR_US, 0.0
    else:
        limit = ended
        short_by = max(MINIMUM_S - (ended - started) / US, 0.0)
    begin = started if settled is None else settled
    if limit <= begin and not (short_by and settled is None):
        return [], None
    lines = []
    period = begin - begin % HOUR_US
    while period < limit:
        end = period + HOUR_US
        lines.append(_line(pricer, period, begin if begin > period else period, end if end < limit else limit, 0.0))
        period += HOUR_US
    if short_by:  # a closed run under a minute: never settled before, so its lines start at its start
        if lines:
            lines.pop()
            period -= HOUR_US  # the popped line's
        else:
            period = started - started % HOUR_US
        lines.append(_line(pricer, period, max(begin, period), limit, short_by))
    return lines, max(limit, begin)


MICROSECONDS_PER_HOUR = Decimal(HOUR_US)


def _line(pricer: Pricer, period: int, lo: int, hi: int, extra_s: float) -> Line:
    """One period's line (times in microseconds). Its detail lists the pieces only when there is more
    than one price in it."""
    first, price, first_rate, hourly, pieces = pricer.at(lo)
    changes = pricer.changes
    last = bisect_left(changes, hi, first)  # the changes inside (lo, hi): changes[first:last]
    if last <= first:
        exact = price * (hi - lo)
    else:
        exact, pieces, a = Decimal(0), [], lo
        for i, b in enumerate([*changes[first:last], hi], first):
            _, price, rate, hourly, _ = pricer.at(a, i)
            exact += price * (b - a)
            since = moment(a).isoformat() if i == first else _hour_or_change(a)[1]
            pieces.append({"from": since, "seconds": (b - a) / US, "hourly": hourly, "rate": rate.id})
            a = b
    if extra_s:
        exact += price * int(extra_s * 1_000_000)
        pieces = [*pieces, {"minimum_extra_seconds": extra_s, "hourly": hourly}]
    return Line(
        period_start=_hour_or_change(period)[0],
        seconds=(hi - lo) / US + extra_s,
        amount=(exact / MICROSECONDS_PER_HOUR).quantize(CENT, rounding=ROUND_HALF_UP),
        rate_id=first_rate.id,
        pieces=pieces,
    )


# --- the rating's inputs from the database's rows (a RateCard, a MeterSegment with its workload) ---


def rate_of(card) -> Rate:
    """A RateCard row as the rating reads it."""
    return Rate(
        card.pk,
        card.effective_from,
        card.card_hour,
        card.cpus_per_card,
        card.memory_gb_per_card,
        card.cpu_core_hour,
        card.memory_gb_hour,
        card.no_gpu_hour,
        card.spot_ceiling,
    )


def shape_of(segment) -> Shape:
    """What a segment's work holds (``segment.workload`` loaded); no_gpu and spot are the segment's own."""
    workload = segment.workload
    return Shape(
        gpu_model=workload.gpu_model,
        cards=segment.cards or workload.gpu_count,  # older segments recorded no size of their own
        milli=workload.gpu_milli,
        cpu_cores=workload.cpu_cores,
        memory_mb=workload.memory_mb,
        spot=segment.spot,
        no_gpu=segment.no_gpu,
    )
