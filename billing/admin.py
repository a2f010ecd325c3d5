"""Admin for billing: rate cards (new versions only), wallets with top-up, top-ups waiting for a second person's
approval, the ledger (read-only), teams."""

import secrets
from decimal import Decimal

from django import forms
from django.contrib import admin, messages
from django.shortcuts import redirect, render

from billing.models import (
    Account,
    Membership,
    MeterSegment,
    Posting,
    PostingKind,
    RateCard,
    SpotPrice,
    Team,
    TopUpRequest,
)
from billing.services import TOP_UP_APPROVAL_ABOVE, TOP_UP_PERMISSION, posting_key, top_up_approve, wallet_top_up
from core.admin import ReadOnlyAdmin
from core.errors import ServiceError


@admin.register(MeterSegment)
class MeterSegmentAdmin(admin.ModelAdmin):
    list_display = ["workload", "started_at", "ended_at", "settled_until", "account", "end_reason"]
    list_filter = ["ended_at"]
    readonly_fields = ["workload", "started_at", "ended_at", "end_reason", "account", "rate_card", "settled_until"]


@admin.register(RateCard)
class RateCardAdmin(admin.ModelAdmin):
    """A rate in force is never edited: a new price is a new version with its own effective_from."""

    list_display = [
        "gpu_model",
        "effective_from",
        "card_hour",
        "spot_floor",
        "spot_ceiling",
        "cpu_core_hour",
        "memory_gb_hour",
        "no_gpu_hour",
        "storage_gb_day",
        "free_storage_gb",
        "currency",
    ]
    list_filter = ["gpu_model"]

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        obj.created_by = request.user
        super().save_model(request, obj, form, change)


@admin.register(SpotPrice)
class SpotPriceAdmin(admin.ModelAdmin):
    list_display = ["gpu_model", "effective_from", "card_hour", "load"]
    list_filter = ["gpu_model"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class TopUpForm(forms.Form):
    amount = forms.DecimalField(min_value=Decimal("0.01"), max_digits=14, decimal_places=2)
    kind = forms.ChoiceField(
        choices=[(PostingKind.TOPUP, "Top-up"), (PostingKind.CREDIT, "Credit"), (PostingKind.REFUND, "Refund")]
    )
    memo = forms.CharField(max_length=255, help_text="Why: shown to the user and kept in the ledger.")
    # One use: made when the form is shown, it keys the postings, so the same form sent twice credits once.
    once = forms.CharField(widget=forms.HiddenInput, max_length=64)


@admin.register(Account)
class AccountAdmin(admin.ModelAdmin):
    list_display = ["__str__", "kind", "balance", "monthly_budget", "low_balance_since"]
    list_filter = ["kind"]
    search_fields = ["user__username", "team__slug"]
    readonly_fields = ["kind", "user", "team", "currency", "balance", "low_balance_since", "created_at"]
    actions = ["top_up"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_top_up_permission(self, request):
        return request.user.has_perm(TOP_UP_PERMISSION)

    @admin.action(description="Top up, credit or refund the selected wallets", permissions=["top_up"])
    def top_up(self, request, queryset):
        form = TopUpForm(request.POST if "apply" in request.POST else None, initial={"once": secrets.token_hex(16)})
        if form.is_valid():
            d = form.cleaned_data
            posted = requested = 0
            for account in queryset:
                try:
                    made, created = wallet_top_up(
                        account=account,
                        amount=d["amount"],
                        kind=d["kind"],
                        reason=d["memo"],
                        by=request.user,
                        idempotency_key=posting_key(scope=f"admin-{account.pk}", key=d["once"]),
                    )
                except ServiceError as exc:  # shown to the admin; the other wallets still go on
                    messages.error(request, f"{account}: {exc}")
                else:
                    if isinstance(made, TopUpRequest):
                        requested += created
                    else:
                        posted += created
            messages.success(request, f"{d['kind']} posted to {posted} wallet(s).")
            if requested:
                messages.warning(
                    request,
                    f"{requested} top-up(s) of more than {TOP_UP_APPROVAL_ABOVE} wait for another holder of the "
                    "top-up permission to approve them (Top-up requests).",
                )
            if posted + requested < queryset.count():
                messages.warning(request, "This form was already sent: nothing was posted twice.")
            return redirect(request.get_full_path())
        return render(
            request,
            "admin/billing/top_up.html",
            {"form": form, "accounts": queryset, "action": "top_up", **self.admin_site.each_context(request)},
        )


@admin.register(Posting)
class PostingAdmin(ReadOnlyAdmin):
    """The ledger: append-only, so read-only here."""

    list_display = [
        "created_at",
        "kind",
        "debit",
        "credit",
        "amount",
        "currency",
        "segment",
        "period_start",
        "memo",
        "created_by",
    ]
    list_filter = ["kind"]
    date_hierarchy = "created_at"


@admin.register(TopUpRequest)
class TopUpRequestAdmin(ReadOnlyAdmin):
    """Top-ups past TOP_UP_APPROVAL_ABOVE: another holder of the permission approves them, and that posts them."""

    list_display = ["created_at", "account", "kind", "amount", "memo", "requested_by", "approved_by"]
    list_filter = ["kind", ("approved_by", admin.EmptyFieldListFilter)]
    actions = ["approve"]

    def has_approve_permission(self, request):
        return request.user.has_perm(TOP_UP_PERMISSION)

    @admin.action(description="Approve (post) the selected top-ups", permissions=["approve"])
    def approve(self, request, queryset):
        for pending in queryset.filter(posting__isnull=True):
            try:
                top_up_approve(request_id=pending.pk, by=request.user)
            except ServiceError as exc:
                messages.error(request, f"{pending}: {exc}")
            else:
                messages.success(request, f"Posted: {pending.kind} {pending.amount} to {pending.account}.")


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    inlines = [MembershipInline]
