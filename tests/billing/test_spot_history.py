"""The spot price history stays bounded: old prices are pruned as new ones are recorded (never one that
settlement still needs), and the console's standing loads only the prices its unsettled time needs."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import enforcement
from billing.enforcement import standing
from billing.ledger import user_account
from billing.models import MeterSegment, RateCard, SpotPrice
from billing.prices import spot_prune, spot_recompute
from billing.selectors import timelines
from scheduler.models import WorkloadStatus
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db
DAY = timedelta(days=1)


def prices(model: str, *ages: int) -> None:
    now = timezone.now()
    for days in ages:
        SpotPrice.objects.create(gpu_model=model, effective_from=now - days * DAY, card_hour=Decimal("1.0"), load=0.5)


def ages(model: str) -> list[int]:
    now = timezone.now()
    found = SpotPrice.objects.filter(gpu_model=model).values_list("effective_from", flat=True)
    return sorted((round((now - t) / DAY) for t in found), reverse=True)


def test_old_spot_prices_go_but_the_one_in_force_and_those_settlement_still_needs_stay(user):
    prices("RTX3090", 100, 80, 70, 10)
    prices("A100-80GB", 90)
    unsettled = MeterSegment.objects.create(
        workload=workload(user, status=WorkloadStatus.RUNNING, spot=True), started_at=timezone.now() - 85 * DAY
    )

    assert spot_prune() == 0  # its time since 85 days ago is still to be charged, at the price of 100 days ago
    unsettled.settled_until = timezone.now() - 75 * DAY
    unsettled.save()
    assert spot_prune() == 1
    assert ages("RTX3090") == [80, 70, 10]

    unsettled.ended_at = unsettled.settled_until
    unsettled.save()
    assert spot_prune() == 1
    assert ages("RTX3090") == [70, 10]  # in force 62 days ago
    assert ages("A100-80GB") == [90]  # still in force


def test_recording_a_new_spot_price_prunes_the_history(catalog, sim_node):
    prices("RTX3090", 100, 90, 80)
    assert spot_recompute() >= 1
    assert ages("RTX3090") == [80, 0]


def test_the_console_loads_only_the_spot_prices_its_unsettled_time_needs(user, catalog, monkeypatch):
    now = timezone.now()
    RateCard.objects.create(gpu_model="RTX3090", effective_from=now - 30 * DAY, card_hour=Decimal("2.00"))
    SpotPrice.objects.bulk_create(
        SpotPrice(gpu_model="RTX3090", effective_from=now - timedelta(hours=h), card_hour=Decimal("0.5"), load=0.1)
        for h in range(1, 300)
    )
    w = workload(user, status=WorkloadStatus.RUNNING, spot=True)
    MeterSegment.objects.create(workload=w, started_at=now - timedelta(hours=2, minutes=30), spot=True)
    loaded = []

    def spy(since=None):
        lines = timelines(since=since)
        loaded.append(len(lines["RTX3090"].spot))
        return lines

    monkeypatch.setattr(enforcement, "timelines", spy)
    owed = standing(user_account(user)).unsettled  # what every console page shows

    assert loaded == [3]  # in force 2.5 hours ago, and the two since
    monkeypatch.setattr(enforcement, "timelines", lambda since=None: timelines())
    assert standing(user_account(user)).unsettled == owed > 0
