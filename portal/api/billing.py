"""REST API for money: my balance and budget, my statement, prices before I commit, and top-ups (by permission)."""

from decimal import Decimal

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import enforcement, ledger, prices, selectors, statements
from billing import services as billing_services
from billing.models import PostingKind, TopUpRequest
from core.errors import InvalidInput, NotFound
from portal.api.idempotency import HEADER, idempotent
from portal.api.views import IDEMPOTENCY_KEY
from portal.models import GpuType
from portal.services import work

MONEY = dict(max_digits=14, decimal_places=2)


class AccountOutput(serializers.Serializer):
    currency = serializers.CharField()
    balance = serializers.DecimalField(**MONEY)
    unsettled = serializers.DecimalField(**MONEY, help_text="Usage not yet settled into the ledger.")
    available = serializers.DecimalField(**MONEY, help_text="Balance less unsettled usage: work stops at zero.")
    month_spend = serializers.DecimalField(**MONEY)
    monthly_budget = serializers.DecimalField(**MONEY, allow_null=True)
    stops_at = serializers.DateTimeField(allow_null=True, help_text="When running work stops, if it will.")


def account_view(account) -> dict:
    current = enforcement.standing(account)
    return {
        "currency": account.currency,
        "balance": current.balance,
        "unsettled": current.unsettled,
        "available": current.available,
        "month_spend": current.month_spend,
        "monthly_budget": current.budget,
        "stops_at": current.stop_at,
    }


class BillingApi(APIView):
    """GET /billing/: my wallet; PATCH: set my monthly budget (warns at 80 %, stops work at 100 %)."""

    class BudgetInput(serializers.Serializer):
        # The rules (0 or more; null removes it) are billing.services.budget_amount's, as for the console.
        monthly_budget = serializers.DecimalField(**MONEY, allow_null=True)

    @extend_schema(responses=AccountOutput)
    def get(self, request):
        return Response(AccountOutput(account_view(ledger.user_account(request.user))).data)

    @extend_schema(request=BudgetInput, responses=AccountOutput)
    def patch(self, request):
        data = self.BudgetInput(data=request.data)
        data.is_valid(raise_exception=True)
        account = billing_services.budget_set(
            account=ledger.user_account(request.user), budget=data.validated_data["monthly_budget"]
        )
        return Response(AccountOutput(account_view(account)).data)


class StatementApi(APIView):
    """GET /billing/statement/?month=YYYY-MM: one line per instance or job, billed next to busy."""

    class StatementLineOutput(serializers.Serializer):
        name = serializers.CharField()
        kind = serializers.CharField()
        gpu_model = serializers.CharField()
        share = serializers.FloatField()
        billing_mode = serializers.CharField()
        seconds = serializers.FloatField()
        gpu_seconds_billed = serializers.FloatField()
        gpu_seconds_busy = serializers.FloatField(
            allow_null=True, help_text="Null: nothing measured, or not measurable (busy_unmeasured)."
        )
        busy_unmeasured = serializers.BooleanField(
            help_text="A fraction of a card: per-tenant compute is not measurable on a shared card (MPS)."
        )
        amount = serializers.DecimalField(**MONEY)
        group = serializers.CharField(help_text="The job array it belongs to ('array 12: sweep'); empty: none.")

    @extend_schema(responses=StatementLineOutput(many=True))
    def get(self, request):
        month = request.query_params.get("month") or timezone.now().strftime("%Y-%m")
        try:
            lines = statements.statement(ledger.user_account(request.user), month)
        except ValueError as exc:
            raise InvalidInput("month must look like 2026-11", field="month") from exc
        return Response(self.StatementLineOutput(lines, many=True).data)


class PriceApi(APIView):
    """GET /prices/?gpu_type=&gpus=&cpu_cores=&memory_gb=: price per hour now, on-demand and spot."""

    class PriceQueryInput(serializers.Serializer):
        gpu_type = serializers.IntegerField()
        gpus = serializers.DecimalField(max_digits=4, decimal_places=1)
        cpu_cores = serializers.IntegerField(min_value=1, max_value=256, default=1)
        memory_gb = serializers.IntegerField(min_value=1, max_value=4096, default=4)

    class PriceEstimateOutput(serializers.Serializer):
        currency = serializers.CharField()
        cpus_per_card = serializers.IntegerField(help_text="CPU cores included with each card.")
        memory_gb_per_card = serializers.IntegerField(help_text="Memory (GB) included with each card.")
        on_demand_per_hour = serializers.CharField()
        spot_per_hour = serializers.CharField()
        spot_card_hour = serializers.CharField()
        spot_band = serializers.ListField(child=serializers.CharField())

    @extend_schema(parameters=[PriceQueryInput], responses=PriceEstimateOutput)
    def get(self, request):
        query = self.PriceQueryInput(data=request.query_params)
        query.is_valid(raise_exception=True)
        q = query.validated_data
        gpu_type = GpuType.objects.filter(pk=q["gpu_type"], active=True).first()
        if gpu_type is None:
            raise InvalidInput("unknown GPU type", field="gpu_type")
        cards, milli = work.check_gpus(q["gpus"])
        price = prices.estimate(
            gpu_model=gpu_type.name, cards=cards, milli=milli, cpu_cores=q["cpu_cores"], memory_mb=q["memory_gb"] * 1024
        )
        if price is None:
            raise NotFound(f"no rate card for {gpu_type.name} yet")
        return Response(self.PriceEstimateOutput(price).data)


class CanTopUp(BasePermission):
    """Money actions need the ``billing.top_up`` permission: being staff is not enough."""

    def has_permission(self, request, view):
        return bool(
            request.user and request.user.is_active and request.user.has_perm(billing_services.TOP_UP_PERMISSION)
        )


class TopUpOutput(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.CharField()
    amount = serializers.DecimalField(**MONEY)
    currency = serializers.CharField()
    memo = serializers.CharField()
    balance = serializers.DecimalField(**MONEY)


class TopUpRequestOutput(serializers.Serializer):
    request = serializers.IntegerField(source="pk", help_text="Approve it at billing/topups/requests/<id>/approve/.")
    status = serializers.SerializerMethodField()
    kind = serializers.CharField()
    amount = serializers.DecimalField(**MONEY)
    memo = serializers.CharField()
    requested_by = serializers.CharField(source="requested_by.username")

    def get_status(self, obj) -> str:
        return "approved" if obj.posting_id else "pending"


def top_up_body(posting, account) -> dict:
    account.refresh_from_db(fields=["balance"])
    body = {
        "id": posting.pk,
        "kind": posting.kind,
        "amount": posting.amount,
        "currency": posting.currency,
        "memo": posting.memo,
        "balance": account.balance,
    }
    return TopUpOutput(body).data


class TopUpApi(APIView):
    """POST /billing/topups/ (the top-up permission): top up, credit or refund a wallet, once per key, with a reason.

    More than TOP_UP_APPROVAL_ABOVE answers 202 with a pending request that another holder approves."""

    permission_classes = [IsAuthenticated, CanTopUp]

    class TopUpInput(serializers.Serializer):
        username = serializers.CharField(required=False)
        team = serializers.SlugField(required=False)
        amount = serializers.DecimalField(**MONEY, min_value=Decimal("0.01"))
        kind = serializers.ChoiceField(
            choices=[PostingKind.TOPUP, PostingKind.CREDIT, PostingKind.REFUND], default=PostingKind.TOPUP
        )
        memo = serializers.CharField(max_length=255, help_text="Why: shown to the wallet's owner, kept in the ledger.")

    @extend_schema(
        request=TopUpInput, responses={201: TopUpOutput, 202: TopUpRequestOutput}, parameters=[IDEMPOTENCY_KEY]
    )
    def post(self, request):
        data = self.TopUpInput(data=request.data)
        data.is_valid(raise_exception=True)
        d = data.validated_data
        account = selectors.payee_wallet(username=d.get("username", ""), team=d.get("team", ""))
        key = request.headers.get(HEADER)
        posting_key = billing_services.posting_key(scope=f"api-{request.user.pk}", key=key) if key else None

        def create():
            posted, _ = billing_services.wallet_top_up(
                account=account,
                amount=d["amount"],
                kind=d["kind"],
                reason=d["memo"],
                by=request.user,
                idempotency_key=posting_key,
            )
            if isinstance(posted, TopUpRequest):  # past TOP_UP_APPROVAL_ABOVE: another holder approves it
                return Response(TopUpRequestOutput(posted).data, status=status.HTTP_202_ACCEPTED)
            return Response(top_up_body(posted, account), status=status.HTTP_201_CREATED)

        return idempotent(request, endpoint="topup", create=create)


class TopUpApproveApi(APIView):
    """POST /billing/topups/requests/<id>/approve/ (the top-up permission, not whoever asked): post it."""

    permission_classes = [IsAuthenticated, CanTopUp]

    @extend_schema(request=None, responses={201: TopUpOutput})
    def post(self, request, request_id: int):
        posting = billing_services.top_up_approve(request_id=request_id, by=request.user)
        return Response(top_up_body(posting, posting.credit), status=status.HTTP_201_CREATED)
