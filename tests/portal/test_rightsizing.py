"""Right-sizing: the smallest share that would have held an instance's measured peak, and this month's saving."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import MeterSegment, RateCard, SpotPrice
from portal.models import Instance
from portal.selectors.rightsizing import Withheld, instance_rightsizing, rightsizing_advice, share_needed
from scheduler.models import WorkloadGpuMinute, WorkloadStatus
from tests.conftest import make_node
from tests.scheduler.factories import workload as make_workload

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 12, 20, 12, 0, tzinfo=UTC)


@pytest.fixture
def node(catalog):
    # The RTX 3090's rate card (1.58 CNY per card-hour, 8 cores and 32 GB per card) in force all month.
    RateCard.objects.filter(gpu_model="RTX3090").update(effective_from=datetime(2026, 11, 1, tzinfo=UTC))
    return make_node("sim:2xRTX3090")


def instance_on(node, catalog, owner, *, gpus="1", cards=1, milli=1000) -> Instance:
    workload = make_workload(
        owner, gpu_count=cards, gpu_milli=milli, cpu=2, memory_mb=8192, node=node, status=WorkloadStatus.RUNNING
    )
    return Instance.objects.create(
        owner=owner,
        name="train",
        image=catalog["image"],
        gpu_type=catalog["rtx3090"],
        gpus=Decimal(gpus),
        cpu_cores=2,
        memory_gb=8,
        disk_gb=10,
        workload=workload,
    )


def measured(instance, node, *, util: float | None, memory_mb: int, minutes: int = 90, cards: int = 1, end=NOW) -> None:
    """What the node agent's rollups write: one row per minute and card (util None: no reading)."""
    gpus = list(node.gpus.order_by("index"))[:cards]
    start = end.replace(second=0, microsecond=0) - timedelta(minutes=minutes)
    WorkloadGpuMinute.objects.bulk_create(
        WorkloadGpuMinute(
            minute=start + timedelta(minutes=i),
            gpu=gpu,
            workload=instance.workload,
            samples=60,
            util_avg=util,
            util_max=None if util is None else min(util * 2, 1.0),
            mem_max_mb=memory_mb,
        )
        for i in range(minutes)
        for gpu in gpus
    )


def ran(instance, start: datetime, end: datetime | None, *, no_gpu=False, spot=False) -> None:
    MeterSegment.objects.create(workload=instance.workload, started_at=start, ended_at=end, no_gpu=no_gpu, spot=spot)


def test_the_share_needed_rounds_up_to_a_size_on_offer_with_headroom():
    assert share_needed(compute=0.25, memory_mb=0, card_memory_mb=24576, headroom_percent=20) == Decimal("0.5")
    assert share_needed(compute=0.15, memory_mb=0, card_memory_mb=24576, headroom_percent=20) == Decimal("0.2")
    assert share_needed(compute=0.0, memory_mb=100, card_memory_mb=24576, headroom_percent=20) == Decimal("0.1")
    assert share_needed(compute=0.1, memory_mb=12288, card_memory_mb=24576, headroom_percent=20) == Decimal("1")
    assert share_needed(compute=1.6, memory_mb=0, card_memory_mb=24576, headroom_percent=20) == Decimal("2")
    assert share_needed(compute=0.8, memory_mb=0, card_memory_mb=24576, headroom_percent=20) == Decimal("1")


def test_with_no_measurements_there_is_no_suggestion(node, catalog, user):
    instance = instance_on(node, catalog, user)
    assert instance_rightsizing(instance, now=NOW) is None


def test_with_too_few_minutes_measured_there_is_no_suggestion(node, catalog, user, settings):
    instance = instance_on(node, catalog, user)
    measured(instance, node, util=0.25, memory_mb=2000, minutes=settings.RIGHTSIZING_MIN_MINUTES - 1)
    assert instance_rightsizing(instance, now=NOW) is None


def test_a_whole_card_used_at_a_quarter_is_told_half_a_card_and_the_saving(node, catalog, user):
    instance = instance_on(node, catalog, user)
    measured(instance, node, util=0.25, memory_mb=4000)
    ran(instance, datetime(2026, 11, 30, 22, tzinfo=UTC), datetime(2026, 12, 1, 2, tzinfo=UTC))  # 2 h this month
    ran(instance, datetime(2026, 12, 20, 0, tzinfo=UTC), datetime(2026, 12, 20, 10, tzinfo=UTC))  # 10 h
    ran(instance, datetime(2026, 12, 20, 10, 30, tzinfo=UTC), None, no_gpu=True)  # not the GPU's price
    suggestion = instance_rightsizing(instance, now=NOW)
    assert suggestion.gpus == Decimal("0.5") and suggestion.holds == Decimal("1")
    assert suggestion.peak.compute == pytest.approx(0.25) and suggestion.peak.memory_mb == 4000
    assert suggestion.peak.minutes == 90 and suggestion.headroom_percent == 20
    # Billing's own rules, hour by hour: a card-hour 1.58; 0.5 of one 0.79 (2 cores and 8 GB fit its
    # allotment). 12 hours of 0.79.
    assert suggestion.saving == Decimal("9.48") and suggestion.currency == "CNY"


def test_spot_time_saves_at_the_spot_price_in_force(node, catalog, user):
    instance = instance_on(node, catalog, user)
    measured(instance, node, util=0.25, memory_mb=4000)
    SpotPrice.objects.create(
        gpu_model="RTX3090", effective_from=datetime(2026, 11, 15, tzinfo=UTC), card_hour=Decimal("0.70"), load=0.5
    )
    SpotPrice.objects.create(
        gpu_model="RTX3090", effective_from=datetime(2026, 12, 19, tzinfo=UTC), card_hour=Decimal("0.80"), load=0.9
    )
    ran(instance, datetime(2026, 12, 1, 0, tzinfo=UTC), datetime(2026, 12, 1, 1, tzinfo=UTC), spot=True)  # at 0.70
    ran(instance, datetime(2026, 12, 20, 0, tzinfo=UTC), datetime(2026, 12, 20, 2, tzinfo=UTC), spot=True)  # at 0.80
    # 0.70 - 0.35, then twice 0.80 - 0.40.
    assert instance_rightsizing(instance, now=NOW).saving == Decimal("1.15")


def test_a_card_used_fully_keeps_its_card(node, catalog, user):
    instance = instance_on(node, catalog, user)
    measured(instance, node, util=0.95, memory_mb=4000)
    assert instance_rightsizing(instance, now=NOW) is None


def test_a_memory_peak_keeps_its_card_however_idle_the_compute(node, catalog, user):
    instance = instance_on(node, catalog, user)
    measured(instance, node, util=0.02, memory_mb=20000)  # 81 % of 24 GB, +20 %: more than 0.9
    assert instance_rightsizing(instance, now=NOW) is None


def test_the_busiest_minute_sets_the_peak_and_old_minutes_are_not_read(node, catalog, user, settings):
    instance = instance_on(node, catalog, user)
    measured(instance, node, util=0.9, memory_mb=4000, minutes=30, end=NOW - timedelta(days=31))  # outside the window
    measured(instance, node, util=0.1, memory_mb=2000)
    measured(instance, node, util=0.15, memory_mb=2000, minutes=1, end=NOW - timedelta(hours=3))  # one busy minute
    suggestion = instance_rightsizing(instance, now=NOW)
    assert suggestion.peak.compute == pytest.approx(0.15) and suggestion.gpus == Decimal("0.2")
    settings.RIGHTSIZING_HEADROOM_PERCENT = 50  # 0.225: past 0.2, the next size on offer
    assert instance_rightsizing(instance, now=NOW).gpus == Decimal("0.5")


def test_two_cards_barely_used_are_told_one_share_of_one_card(node, catalog, user):
    instance = instance_on(node, catalog, user, gpus="2", cards=2)
    measured(instance, node, util=0.2, memory_mb=3000, cards=2)  # 0.4 of a card's compute, 6000 MiB
    assert instance_rightsizing(instance, now=NOW).gpus == Decimal("0.5")


def test_a_fraction_is_read_as_its_share_of_the_card(node, catalog, user):
    instance = instance_on(node, catalog, user, gpus="0.5", milli=500)
    measured(instance, node, util=0.3, memory_mb=2000)  # 30 % of half a card: 0.15 of a card
    assert instance_rightsizing(instance, now=NOW).gpus == Decimal("0.2")
    WorkloadGpuMinute.objects.update(util_avg=0.9)  # 0.45 of a card: it needs its half
    assert instance_rightsizing(instance, now=NOW) is None


def test_a_fraction_with_minutes_without_a_reading_gets_no_advice_and_is_told_why(node, catalog, user, client):
    # Under MPS a fraction reads 0 with no process on the card and nothing while one runs: the unread minutes
    # are the busy ones, and the 0s alone would say "0.1 of a card".
    instance = instance_on(node, catalog, user, gpus="0.5", milli=500)
    now = timezone.now()
    measured(instance, node, util=0.0, memory_mb=500, minutes=90, end=now - timedelta(hours=1))
    measured(instance, node, util=None, memory_mb=9000, minutes=30, end=now)
    assert instance_rightsizing(instance, now=now) is None
    advice = rightsizing_advice(instance, now=now)
    assert isinstance(advice, Withheld) and advice.unread_minutes == 30
    client.force_login(user)
    page = client.get(f"/instances/{instance.pk}/").content.decode()
    assert "data-rightsizing-withheld" in page and "data-rightsizing>" not in page
    assert "Per-tenant compute is not measurable on a shared card: 30 minutes" in page


def test_a_whole_cards_unread_minute_is_a_gap_left_out(node, catalog, user):
    instance = instance_on(node, catalog, user)
    measured(instance, node, util=0.25, memory_mb=4000, end=NOW - timedelta(hours=1))
    measured(instance, node, util=None, memory_mb=4000, minutes=1)
    assert instance_rightsizing(instance, now=NOW).gpus == Decimal("0.5")


def test_the_api_and_the_instance_page_show_it_to_the_owner_only(node, catalog, user, api, outsider_api, client):
    instance = instance_on(node, catalog, user)
    measured(instance, node, util=0.25, memory_mb=4000, end=timezone.now())
    ran(instance, timezone.now() - timedelta(minutes=30), None)
    body = api.get(f"/api/v1/instances/{instance.pk}/").json()
    assert body["rightsizing"]["gpus"] == "0.5" and body["rightsizing"]["holds"] == "1.0"
    assert body["rightsizing"]["peak_gpu"] == 0.25 and body["rightsizing"]["currency"] == "CNY"
    assert Decimal(body["rightsizing"]["saving_this_month"]) >= 0
    assert outsider_api.get(f"/api/v1/instances/{instance.pk}/").status_code == 404
    client.force_login(user)
    page = client.get(f"/instances/{instance.pk}/").content.decode()
    assert "data-rightsizing" in page and "Asking for 0.5 cards instead of 1" in page and "25%" in page
    client.post("/i18n/setlang/", {"language": "zh-hans"})
    page = client.get(f"/instances/{instance.pk}/").content.decode()
    assert "规格建议" in page and "申请 0.5 张卡而不是 1 张" in page


def test_without_measurements_the_api_says_null_and_the_page_says_nothing(node, catalog, user, api, client):
    instance = instance_on(node, catalog, user)
    assert api.get(f"/api/v1/instances/{instance.pk}/").json()["rightsizing"] is None
    client.force_login(user)
    assert "data-rightsizing" not in client.get(f"/instances/{instance.pk}/").content.decode()
