"""The arithmetic of charges: shares, minimums, spot, rate changes, hour boundaries, rounding."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing.rating import HOUR_US, US, Pricer, Rate, Shape, Timeline, charge_lines, hourly_price, lines_between, micros

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
RTX = Rate(
    1,
    T0 - timedelta(days=30),
    Decimal("1.58"),
    cpus_per_card=8,
    memory_gb_per_card=32,
    cpu_core_hour=Decimal("0.05"),
    memory_gb_hour=Decimal("0.01"),
    no_gpu_hour=Decimal("0.10"),
)


def shape(cards=1, milli=1000, cpu=1, memory_mb=1024, **kw):
    return Shape("RTX3090", cards, milli, cpu, memory_mb, **kw)


def settle(s, start, seconds, *, timeline=None, settled_until=None, settle_to=None):
    end = None if seconds is None else start + timedelta(seconds=seconds)
    return charge_lines(
        s,
        started_at=start,
        ended_at=end,
        settled_until=settled_until,
        settle_to=settle_to or (end or start) + timedelta(seconds=1),
        timeline=timeline or Timeline([RTX]),
    )


@pytest.mark.parametrize(
    ("seconds", "billed", "amount"),
    [
        (61, 61, "0.01"),  # 0.3 x 1.58 x 61 / 3600 = 0.008031.. -> 0.01
        (59, 60, "0.01"),  # under a minute: charged 60 s (0.0079 -> 0.01)
        (3600, 3600, "0.47"),  # 0.474 -> 0.47
        (0, 60, "0.01"),  # started and stopped in the same instant: still the minute
    ],
)
def test_a_third_of_a_card_pays_a_third_per_second_with_a_minute_minimum(seconds, billed, amount):
    lines, settled = settle(shape(milli=300), T0 + timedelta(minutes=5), seconds)
    assert sum(line.seconds for line in lines) == billed
    assert sum(line.amount for line in lines) == Decimal(amount)
    assert settled == T0 + timedelta(minutes=5, seconds=seconds)


def test_two_spot_cards_pay_the_spot_price_in_force():
    spot = Timeline(
        [RTX], spot=[(T0 - timedelta(hours=1), Decimal("0.60")), (T0 + timedelta(minutes=30), Decimal("0.90"))]
    )
    [line] = settle(shape(cards=2, spot=True), T0, 3600, timeline=spot)[0]
    # 2 cards x (0.60 for 30 min + 0.90 for 30 min) = 0.60 + 0.90
    assert line.amount == Decimal("1.50")
    assert [p["hourly"] for p in line.pieces] == ["1.20", "1.80"]


def test_a_rate_change_applies_to_new_time_only():
    dearer = Rate(2, T0 + timedelta(minutes=20), Decimal("3.16"))
    [line] = settle(shape(), T0, 3600, timeline=Timeline([RTX, dearer]))[0]
    # 1.58 x 20 / 60 + 3.16 x 40 / 60 = 0.52667 + 2.10667 = 2.63333 -> 2.63
    assert line.amount == Decimal("2.63") and line.rate_id == 1


def test_a_segment_across_hours_gets_one_line_per_hour():
    lines, _ = settle(shape(), T0 + timedelta(minutes=30), 2 * 3600)  # 10:30 .. 12:30
    assert [(line.period_start.hour, line.seconds) for line in lines] == [(10, 1800), (11, 3600), (12, 1800)]
    assert [line.amount for line in lines] == [Decimal("0.79"), Decimal("1.58"), Decimal("0.79")]


def test_an_open_segment_settles_whole_hours_only_and_resumes_where_it_stopped():
    start = T0 + timedelta(minutes=30)
    first, settled = settle(shape(), start, None, settle_to=T0 + timedelta(hours=2, minutes=5))
    assert [line.period_start.hour for line in first] == [10, 11] and settled == T0 + timedelta(hours=2)
    again, _ = settle(shape(), start, None, settled_until=settled, settle_to=T0 + timedelta(hours=2, minutes=50))
    assert again == [], "the hour now running is not charged before it ends"
    rest, end = settle(shape(), start, 2 * 3600, settled_until=settled)
    assert [(line.period_start.hour, line.seconds) for line in rest] == [(12, 1800)] and end == start + timedelta(
        hours=2
    )


def test_rounding_is_once_per_line_half_up_to_the_cent():
    # 0.1 card for 1,710 s: 0.158 x 1710 / 3600 = 0.07505 -> 0.08 (half up), never 0.07 + drift
    [line] = settle(shape(milli=100), T0, 1710)[0]
    assert line.amount == Decimal("0.08")


def test_cores_and_memory_beyond_the_cards_allotment_pay_their_own_price():
    # half a card includes 4 cores and 16 GB; 6 cores and 20 GB pay 2 x 0.05 + 4 x 0.01 extra
    assert hourly_price(shape(milli=500, cpu=6, memory_mb=20 * 1024), RTX) == Decimal("0.79") + Decimal("0.14")
    assert hourly_price(shape(no_gpu=True, cpu=2), RTX) == Decimal("0.10")


def test_lines_of_one_price_share_their_detail_and_a_minimum_never_writes_into_it():
    """A pricer works a price out once per stretch and hands every one-price line the same detail; the
    minute's extra piece goes on a copy, or every later line of that price would carry it."""
    timeline = Timeline([RTX], spot=[(T0 - timedelta(hours=1), Decimal("0.60"))])
    pricer = Pricer(shape(spot=True), timeline)
    start = micros(T0 + timedelta(minutes=5))

    [short], _ = lines_between(pricer, started=start, ended=start + 20 * US, settled=None, settle_to=start + HOUR_US)
    [long], _ = lines_between(pricer, started=start, ended=start + 600 * US, settled=None, settle_to=start + HOUR_US)
    [other], _ = lines_between(pricer, started=start + US, ended=start + 700 * US, settled=None, settle_to=start)

    assert short.pieces == [{"hourly": "0.60", "rate": 1}, {"minimum_extra_seconds": 40.0, "hourly": "0.60"}]
    assert long.pieces == [{"hourly": "0.60", "rate": 1}] and long.pieces is other.pieces
    assert (short.seconds, long.seconds) == (60, 600)


def test_times_in_microseconds_give_the_same_lines_as_times_in_any_zone():
    """charge_lines (aware times, any zone) and lines_between (microseconds) are one computation."""
    from zoneinfo import ZoneInfo

    beijing = ZoneInfo("Asia/Shanghai")
    start = (T0 + timedelta(minutes=50, microseconds=7)).astimezone(beijing)
    lines, settled = settle(shape(milli=500), start, 2 * 3600 + 0.5)

    assert [(line.period_start, line.seconds) for line in lines] == [
        (T0, 600 - 0.000007),
        (T0 + timedelta(hours=1), 3600),
        (T0 + timedelta(hours=2), 3000.500007),
    ]
    assert settled == start + timedelta(seconds=2 * 3600 + 0.5) and lines[0].period_start.tzinfo is UTC
