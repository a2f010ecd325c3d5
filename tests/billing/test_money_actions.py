"""Money made by people: a top-up needs its own permission (not just staff), a reason, and happens once.

Budgets are set through one service, so the console and the API refuse the same amounts.
"""

import re
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from rest_framework.test import APIClient

from billing import services
from billing.ledger import user_account
from billing.models import Account, Membership, Posting, PostingKind, Team, TopUpRequest
from core.errors import InvalidInput, ServiceError

pytestmark = pytest.mark.django_db

TOPUPS = "/api/v1/billing/topups/"


def staff_user(django_user_model, name: str, *perms: str):
    person = django_user_model.objects.create_user(name, password=f"{name}-pass-123", is_staff=True)
    person.user_permissions.add(*Permission.objects.filter(codename__in=perms, content_type__app_label="billing"))
    return django_user_model.objects.get(pk=person.pk)  # no cached permissions


def api_as(person) -> APIClient:
    client = APIClient()
    client.force_authenticate(person)
    return client


def test_staff_without_the_top_up_permission_cannot_create_money_through_the_api(user, django_user_model):
    body = {"username": user.username, "amount": "25.00", "memo": "bank transfer 42"}
    clerk = staff_user(django_user_model, "clerk")
    assert api_as(clerk).post(TOPUPS, body, format="json").status_code == 403
    cashier = staff_user(django_user_model, "cashier", "top_up")
    assert api_as(cashier).post(TOPUPS, body, format="json").status_code == 201
    assert [p.created_by.username for p in Posting.objects.filter(kind=PostingKind.TOPUP)] == ["cashier"]


def test_a_top_up_needs_a_reason_and_records_who_gave_it(user, django_user_model):
    cashier = staff_user(django_user_model, "cashier", "top_up")
    response = api_as(cashier).post(TOPUPS, {"username": user.username, "amount": "5", "memo": "   "}, format="json")
    assert response.status_code == 400 and "memo" in response.data
    with pytest.raises(InvalidInput) as refused:
        services.wallet_top_up(account=user_account(user), amount=Decimal(5), kind="topup", reason=" ", by=cashier)
    assert refused.value.field == "memo"
    assert not Posting.objects.filter(kind=PostingKind.TOPUP).exists()


def test_the_service_refuses_a_top_up_from_someone_without_the_permission(user, django_user_model):
    clerk = staff_user(django_user_model, "clerk")
    before = user_account(user).balance
    with pytest.raises(ServiceError):
        services.wallet_top_up(account=user_account(user), amount=Decimal(5), kind="topup", reason="x", by=clerk)
    assert user_account(user).balance == before


def test_a_long_idempotency_key_on_a_top_up_is_not_a_server_error(user, django_user_model):
    cashier = api_as(staff_user(django_user_model, "cashier", "top_up"))
    body = {"username": user.username, "amount": "5.00", "memo": "wire"}
    before = user_account(user).balance
    for _ in range(2):
        response = cashier.post(TOPUPS, body, format="json", HTTP_IDEMPOTENCY_KEY="k" * 255)
        assert response.status_code == 201
    assert cashier.post(TOPUPS, body, format="json", HTTP_IDEMPOTENCY_KEY="k" * 256).status_code == 400
    assert user_account(user).balance == before + Decimal("5.00")


def admin_client(person) -> Client:
    client = Client()
    client.force_login(person)
    return client


def admin_top_up_form(client: Client, account: Account) -> dict:
    """The action's form, as the admin's changelist renders it after choosing wallets and the action."""
    page = client.post("/admin/billing/account/", {"action": "top_up", "_selected_action": [account.pk], "index": 0})
    assert page.status_code == 200, page.status_code
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', page.content.decode()))
    return fields | {"_selected_action": [account.pk], "amount": "10.00", "kind": "topup", "memo": "bank transfer 7"}


def test_the_admin_top_up_action_needs_the_permission(user, django_user_model):
    account = user_account(user)
    before = account.balance
    clerk = staff_user(django_user_model, "clerk", "view_account", "change_account")
    client = admin_client(clerk)
    response = client.post(
        "/admin/billing/account/",
        {
            "action": "top_up",
            "_selected_action": [account.pk],
            "amount": "10",
            "kind": "topup",
            "memo": "x",
            "apply": 1,
        },
    )
    assert response.status_code in (200, 302)
    account.refresh_from_db()
    assert account.balance == before and not Posting.objects.filter(kind=PostingKind.TOPUP).exists()


def test_a_double_submitted_admin_top_up_credits_once(user, django_user_model):
    account = user_account(user)
    before = account.balance
    cashier = staff_user(django_user_model, "cashier", "view_account", "change_account", "top_up")
    client = admin_client(cashier)
    form = admin_top_up_form(client, account)
    for _ in range(2):  # the browser's double click: the same form twice
        assert client.post("/admin/billing/account/", form | {"apply": "Post"}).status_code == 302
    account.refresh_from_db()
    assert account.balance == before + Decimal("10.00")
    posting = Posting.objects.get(kind=PostingKind.TOPUP)
    assert (posting.created_by, posting.memo) == (cashier, "bank transfer 7")
    # A new form is a new top-up.
    assert (
        client.post("/admin/billing/account/", admin_top_up_form(client, account) | {"apply": "Post"}).status_code
        == 302
    )
    account.refresh_from_db()
    assert account.balance == before + Decimal("20.00")


@pytest.mark.parametrize("amount", ["-1", "abc", "1e20", "Infinity", "NaN", "12345678901234.5", "0.001"])
def test_a_budget_the_api_refuses_the_console_refuses_too(api, user, amount):
    before = user_account(user).monthly_budget
    assert api.patch("/api/v1/billing/", {"monthly_budget": amount}, format="json").status_code == 400
    console = admin_client(user)
    response = console.post("/billing/", {"monthly_budget": amount}, follow=True)
    assert response.status_code == 200
    assert user_account(user).monthly_budget == before


def test_a_budget_is_set_and_removed_the_same_way_from_the_console_and_the_api(api, user):
    console = admin_client(user)
    console.post("/billing/", {"monthly_budget": "300"})
    assert user_account(user).monthly_budget == Decimal("300")
    assert api.patch("/api/v1/billing/", {"monthly_budget": None}, format="json").status_code == 200
    assert user_account(user).monthly_budget is None
    assert api.patch("/api/v1/billing/", {"monthly_budget": "12.5"}, format="json").status_code == 200
    console.post("/billing/", {"monthly_budget": ""})
    assert user_account(user).monthly_budget is None


def test_a_holder_of_the_permission_cannot_top_up_their_own_wallet_past_the_small_limit(django_user_model):
    cashier = staff_user(django_user_model, "cashier", "top_up")
    body = {"username": "cashier", "amount": "10000.00", "memo": "bonus"}
    before = user_account(cashier).balance
    refused = api_as(cashier).post(TOPUPS, body, format="json")
    assert refused.status_code == 400 and "another holder" in refused.data["amount"][0]
    small = body | {"amount": str(services.SELF_TOP_UP_MAX)}
    assert api_as(cashier).post(TOPUPS, small, format="json").status_code == 201
    assert user_account(cashier).balance == before + services.SELF_TOP_UP_MAX
    other = staff_user(django_user_model, "other", "top_up")  # another holder may
    assert api_as(other).post(TOPUPS, body | {"amount": "500.00"}, format="json").status_code == 201


def test_nor_the_wallet_of_a_team_they_belong_to(user, django_user_model):
    cashier = staff_user(django_user_model, "cashier", "top_up")
    team = Team.objects.create(slug="lab", name="Lab")
    Membership.objects.create(team=team, user=cashier)
    Membership.objects.create(team=Team.objects.create(slug="other", name="Other"), user=user)
    refused = api_as(cashier).post(TOPUPS, {"team": "lab", "amount": "500.00", "memo": "x"}, format="json")
    assert refused.status_code == 400 and "amount" in refused.data
    assert not Posting.objects.filter(kind=PostingKind.TOPUP).exists()
    other = {"team": "other", "amount": "500.00", "memo": "x"}
    assert api_as(cashier).post(TOPUPS, other, format="json").status_code == 201


def test_a_top_up_past_the_approval_limit_is_posted_only_when_another_holder_approves_it(user, django_user_model):
    cashier = api_as(staff_user(django_user_model, "cashier", "top_up"))
    before = user_account(user).balance
    big = str(services.TOP_UP_APPROVAL_ABOVE + 1)
    asked = cashier.post(TOPUPS, {"username": user.username, "amount": big, "memo": "wire 9"}, format="json")
    assert asked.status_code == 202 and asked.data["status"] == "pending", asked.data
    assert user_account(user).balance == before and not Posting.objects.filter(kind=PostingKind.TOPUP).exists()
    approve = f"{TOPUPS}requests/{asked.data['request']}/approve/"

    assert cashier.post(approve).status_code == 409, "not by whoever asked"
    assert api_as(staff_user(django_user_model, "clerk")).post(approve).status_code == 403
    assert api_as(user).post(approve).status_code == 403
    assert user_account(user).balance == before

    approver = staff_user(django_user_model, "approver", "top_up")
    for _ in range(2):  # approving twice posts once
        approved = api_as(approver).post(approve)
        assert approved.status_code == 201 and approved.data["balance"] == str(before + Decimal(big))
    posting = Posting.objects.get(kind=PostingKind.TOPUP)
    assert (posting.created_by, posting.memo, posting.amount) == (approver, "wire 9", Decimal(big))
    assert TopUpRequest.objects.get().approved_by == approver


def test_the_admin_top_up_past_the_approval_limit_waits_for_the_approve_action(user, django_user_model):
    account = user_account(user)
    before = account.balance
    cashier = staff_user(django_user_model, "cashier", "view_account", "change_account", "view_topuprequest", "top_up")
    form = admin_top_up_form(admin_client(cashier), account) | {"amount": "5000.00", "apply": "Post"}
    assert admin_client(cashier).post("/admin/billing/account/", form).status_code == 302
    account.refresh_from_db()
    assert account.balance == before and TopUpRequest.objects.get().posting is None

    approver = staff_user(django_user_model, "approver", "view_topuprequest", "top_up")
    action = {"action": "approve", "_selected_action": [TopUpRequest.objects.get().pk], "index": 0}
    assert admin_client(cashier).post("/admin/billing/topuprequest/", action).status_code == 302
    account.refresh_from_db()
    assert account.balance == before, "not by whoever asked"
    assert admin_client(approver).post("/admin/billing/topuprequest/", action).status_code == 302
    account.refresh_from_db()
    assert account.balance == before + Decimal("5000.00")
    assert Posting.objects.get(kind=PostingKind.TOPUP).created_by == approver


def test_the_service_refuses_an_approval_from_someone_without_the_permission(user, django_user_model):
    cashier = staff_user(django_user_model, "cashier", "top_up")
    amount = services.TOP_UP_APPROVAL_ABOVE + 1
    pending, _ = services.wallet_top_up(account=user_account(user), amount=amount, kind="topup", reason="x", by=cashier)
    for person in (staff_user(django_user_model, "clerk"), user):
        with pytest.raises(ServiceError):
            services.top_up_approve(request_id=pending.pk, by=person)
    services.top_up_approve(request_id=pending.pk, by=staff_user(django_user_model, "approver", "top_up"))
    with pytest.raises(ServiceError):  # nor, once approved, hands its posting to anyone
        services.top_up_approve(request_id=pending.pk, by=user)
