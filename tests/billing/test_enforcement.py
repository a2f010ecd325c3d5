"""Money limits: an empty wallet stops running work for real; new work is refused; budgets; top-ups; prices."""

from decimal import Decimal

import pytest
from django.utils import timezone

from agent.launcher import docker_client
from billing.enforcement import enforce, standing
from billing.ledger import ledger_check, platform_account, transfer, user_account
from billing.models import AccountKind, MeterSegment, Posting, PostingKind, RateCard, SpotPrice
from billing.prices import spot_recompute
from billing.settlement import settle
from portal.models import Instance
from scheduler.models import Gpu
from tests.conftest import wait_status
from tests.portal.test_instance_api import create

pytestmark = pytest.mark.django_db


def empty(account) -> None:
    """Spend the wallet down to zero (an adjustment posting, as an admin correcting it would)."""
    account.refresh_from_db()
    transfer(
        debit=account,
        credit=platform_account(AccountKind.REVENUE),
        amount=account.balance,
        kind=PostingKind.ADJUSTMENT,
        memo="test: wallet emptied",
    )


@pytest.mark.django_db(transaction=True)
def test_an_empty_wallet_stops_running_work_after_the_grace_and_metering_closes(
    api, user, catalog, node_worker, settings
):
    settings.BILLING_GRACE_S = 0
    assert create(api, catalog).status_code == 201
    workload = Instance.objects.get().workload
    wait_status(workload, "running", timeout=30)
    account = user_account(user)
    empty(account)
    assert enforce() == [], "the first pass starts the grace period (and the console warns)"
    account.refresh_from_db()
    assert account.low_balance_since is not None and standing(account).exhausted
    assert enforce() == [workload.pk]
    wait_status(workload, "stopped", timeout=30)
    workload.refresh_from_db()
    assert "balance exhausted" in workload.status_reason
    assert docker_client().containers.get(workload.container_name).status == "exited"
    segment = MeterSegment.objects.get(workload=workload)
    assert segment.ended_at is not None, "metering closed when the container really stopped"
    settle()
    assert Posting.objects.filter(segment=segment, kind=PostingKind.USAGE).exists()
    account.refresh_from_db()
    assert account.balance < 0, "the overshoot: what ran during the grace, bounded by it"
    assert ledger_check().ok


def test_new_work_is_refused_on_an_empty_wallet_with_the_field_named(api, user, catalog):
    empty(user_account(user))
    response = create(api, catalog)
    assert response.status_code == 402
    assert "top up" in str(response.data).lower() and "balance" in response.data
    assert not Instance.objects.exists()


def test_a_monthly_budget_refuses_work_once_reached(api, user, catalog):
    account = user_account(user)
    account.monthly_budget = Decimal("0.50")
    account.save()
    transfer(
        debit=account, credit=platform_account(AccountKind.REVENUE), amount=Decimal("0.50"), kind=PostingKind.USAGE
    )
    assert standing(account).over_budget
    response = create(api, catalog)
    assert response.status_code == 402 and "budget" in response.data


def test_top_ups_are_for_the_top_up_permission_and_happen_once_per_key(api, user, django_user_model):
    from rest_framework.test import APIClient

    body = {"username": user.username, "amount": "25.00", "memo": "bank transfer 42"}
    assert api.post("/api/v1/billing/topups/", body, format="json").status_code == 403
    staff = APIClient()
    ops = django_user_model.objects.create_user("ops", is_staff=True, is_superuser=True)  # holds billing.top_up
    staff.force_authenticate(ops)
    before = user_account(user).balance
    for _ in range(2):
        response = staff.post("/api/v1/billing/topups/", body, format="json", HTTP_IDEMPOTENCY_KEY="tx-42")
        assert response.status_code == 201
    assert response.data["balance"] == str(before + Decimal("25.00"))
    topups = Posting.objects.filter(kind=PostingKind.TOPUP)
    assert topups.count() == 1 and topups.get().created_by.username == "ops"
    assert api.get("/api/v1/billing/").data["balance"] == str(before + Decimal("25.00"))


def test_the_price_of_a_configuration_is_shown_on_demand_and_spot(api, catalog):
    response = api.get(f"/api/v1/prices/?gpu_type={catalog['rtx3090'].pk}&gpus=0.5&cpu_cores=2&memory_gb=4")
    assert response.status_code == 200
    assert Decimal(response.data["on_demand_per_hour"]) == Decimal("0.79")  # half of 1.58, extras within allotment
    assert Decimal(response.data["spot_per_hour"]) < Decimal(response.data["on_demand_per_hour"])
    assert api.get("/api/v1/prices/?gpu_type=999&gpus=0.5").status_code == 400


def test_spot_prices_move_with_the_load_inside_the_band(catalog, sim_node):
    rate = RateCard.objects.filter(gpu_model="RTX3090").latest("effective_from")
    spot_recompute()
    idle = SpotPrice.objects.filter(gpu_model="RTX3090").latest("effective_from")
    assert idle.card_hour == (rate.card_hour * rate.spot_floor).quantize(Decimal("0.0001"))
    Gpu.objects.filter(node=sim_node, model="RTX3090").update(allocated_milli=1000)
    spot_recompute(now=timezone.now() + timezone.timedelta(minutes=5))
    full = SpotPrice.objects.filter(gpu_model="RTX3090").latest("effective_from")
    assert full.card_hour == (rate.card_hour * rate.spot_ceiling).quantize(Decimal("0.0001")) and full.load == 1.0
