"""Money pages: my bill (balance, budget, monthly statement, CSV) and the staff billing reports."""

import csv
import io
from datetime import datetime, timedelta
from decimal import Decimal

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods, require_safe

from billing import enforcement, ledger, reports, statements, storage
from billing import services as billing_services
from billing.models import Posting, PostingKind, Team
from core.errors import ServiceError
from scheduler.models import Gpu


def _month(request) -> str:
    month = request.GET.get("month") or timezone.now().strftime("%Y-%m")
    try:
        statements.month_bounds(month)
    except ValueError:
        month = timezone.now().strftime("%Y-%m")
    return month


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def billing_page(request):
    account = ledger.user_account(request.user)
    if request.method == "POST":
        try:
            account = billing_services.budget_set(account=account, budget=request.POST.get("monthly_budget", ""))
        except ServiceError:
            messages.error(request, _("The budget must be an amount (e.g. 300) or empty for none."))
        else:
            saved = account.monthly_budget is not None
            messages.success(request, _("Budget saved.") if saved else _("Budget removed."))
        return redirect("console-billing")
    month = _month(request)
    lines = statements.statement(account, month)
    payments = Posting.objects.filter(
        credit=account, kind__in=[PostingKind.TOPUP, PostingKind.CREDIT, PostingKind.REFUND]
    ).order_by("-created_at")[:50]
    return render(
        request,
        "portal/billing.html",
        {
            "account": account,
            "standing": enforcement.standing(account),
            "month": month,
            "lines": lines,
            "groups": statements.statement_groups(lines),
            "total": sum((line.amount for line in lines), Decimal(0)),
            "payments": payments,
            "shared_storage": storage.shared_storage_of(request.user),
        },
    )


@login_required
@require_safe
def statement_csv(request):
    account = ledger.user_account(request.user)
    month = _month(request)
    response = HttpResponse(
        statements.statement_csv(statements.statement(account, month), account.currency), content_type="text/csv"
    )
    response["Content-Disposition"] = f'attachment; filename="statement-{month}.csv"'
    return response


def _filters(request) -> reports.Filters:
    today = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)

    def day(name, default):
        try:
            return datetime.strptime(request.GET.get(name, ""), "%Y-%m-%d").replace(tzinfo=today.tzinfo)
        except ValueError:
            return default

    start = day("start", today - timedelta(days=29))
    end = day("end", today) + timedelta(days=1)  # the end day is included
    return reports.Filters(
        start, max(end, start + timedelta(days=1)), request.GET.get("gpu_model", ""), request.GET.get("team", "")
    )


@staff_member_required
@require_safe
def billing_reports(request):
    f = _filters(request)
    export = request.GET.get("export")
    if export in reports.TABLES:
        rows = reports.TABLES[export](f)
        out = io.StringIO()
        if rows:
            writer = csv.DictWriter(out, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        response = HttpResponse(out.getvalue(), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="{export}-{f.start:%Y%m%d}-{f.end:%Y%m%d}.csv"'
        return response
    tables = {reports.TITLES[name]: (name, fn(f)) for name, fn in reports.TABLES.items()}
    chart = {
        "days": [row["day"] for row in tables[reports.TITLES["by_day"]][1]],
        "revenue": [float(row["revenue"]) for row in tables[reports.TITLES["by_day"]][1]],
        "gpu_hours": [row["gpu_hours"] for row in tables[reports.TITLES["by_day"]][1]],
    }
    return render(
        request,
        "portal/billing_reports.html",
        {
            "f": f,
            "end_day": (f.end - timedelta(days=1)).date(),
            "tables": tables,
            "chart": chart,
            "check": ledger.ledger_check(),
            "gpu_models": sorted(set(Gpu.objects.values_list("model", flat=True))),
            "teams": Team.objects.order_by("slug").values_list("slug", flat=True),
            "query": request.GET.urlencode(),
        },
    )
