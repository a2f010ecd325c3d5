"""Billing in a real browser: a user's bill (statement, CSV) and the staff reports (charts, CSV, ledger check)."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from billing.models import MeterSegment, RateCard
from billing.settlement import settle
from tests.browser.test_monitor_browser import SCREENSHOTS, sign_in
from tests.scheduler.factories import workload

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def billed(user):
    """Two finished runs of alice's this month: half a card for 2 h, a spot card for 30 min."""
    now = timezone.now()
    # On the hour: each run stays within its hours, so the amounts below are the rounded hour lines.
    start = max(now.replace(day=1, hour=0), now - timedelta(days=2)).replace(minute=0, second=0, microsecond=0)
    RateCard.objects.create(gpu_model="", effective_from=start - timedelta(days=1), card_hour=Decimal(0))
    RateCard.objects.create(gpu_model="RTX3090", effective_from=start - timedelta(days=1), card_hour=Decimal("1.58"))
    for name, milli, spot, minutes in (("train", 500, False, 120), ("sweep", 1000, True, 30)):
        w = workload(user, name=name, gpu_milli=milli, spot=spot, status="stopped")
        MeterSegment.objects.create(
            workload=w, spot=spot, started_at=start, ended_at=start + timedelta(minutes=minutes)
        )  # a segment records whether it ran on spot, as the metering writes it
    settle(now=now)


def test_a_user_reads_the_bill_and_staff_read_the_reports(page, browser, web_server, user, billed, django_user_model):
    base = f"http://{web_server}"
    sign_in(page, base, "alice", "alice-pass-123")
    page.get_by_role("link", name="Billing").first.click()
    statement = page.locator("table.statement")
    expect(statement).to_contain_text("train")
    expect(statement).to_contain_text("1.58")  # half a card for two hours
    expect(statement).to_contain_text("0.55")  # a spot card for 30 min at the band's top (no spot price yet): 1.106 / 2
    expect(page.locator("[data-wallet]")).to_contain_text("this month")
    with page.expect_download() as download:
        page.click("[data-csv]")
    csv_text = open(download.value.path()).read()
    assert csv_text.startswith("name,kind,gpu_model") and "train" in csv_text and "total" in csv_text
    page.screenshot(path=f"{SCREENSHOTS}/billing.png", full_page=True)

    django_user_model.objects.create_user("ops", password="ops-pass-123", is_staff=True)
    staff = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True).new_page()
    sign_in(staff, base, "ops", "ops-pass-123")
    staff.get_by_role("link", name="Reports").click()
    expect(staff.locator("[data-ledger-check]")).to_contain_text("balanced")
    staff.wait_for_function("() => document.querySelector('[data-chart=\"revenue\"]').dataset.drawn >= 1")
    expect(staff.locator('[data-chart="gpu_hours"] canvas')).to_have_count(1)
    expect(staff.locator('[data-table="by_billing_mode"]')).to_contain_text("spot")
    with staff.expect_download() as download:
        staff.click('[data-export="by_gpu_type"]')
    report = open(download.value.path()).read()
    assert report.splitlines()[0].startswith("gpu_type,revenue,gpu_hours") and "RTX3090" in report
    staff.screenshot(path=f"{SCREENSHOTS}/billing-reports.png", full_page=True)
