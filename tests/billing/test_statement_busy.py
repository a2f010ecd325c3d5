"""The bill's busy-vs-billed line: measured where it can be, 'not measurable' for a fraction on a shared card."""

import csv
import io
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from billing.ledger import user_account
from billing.models import MeterSegment, RateCard
from billing.settlement import settle
from billing.statements import BUSY_UNMEASURED, statement
from scheduler.models import WorkloadGpuMinute, WorkloadStatus
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db(transaction=True)


def ran_an_hour(owner, node, *, name: str, milli: int, utils: list[float | None]):
    """Work that ran an hour ending 5 minutes ago, with one rollup minute per entry of ``utils``."""
    w = workload(owner, name=name, gpu_milli=milli, node=node, status=WorkloadStatus.STOPPED)
    end = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=5)
    MeterSegment.objects.create(workload=w, started_at=end - timedelta(hours=1), ended_at=end)
    gpu = node.gpus.order_by("index").first()
    for i, util in enumerate(utils):
        minute = end - timedelta(minutes=len(utils) - i)
        WorkloadGpuMinute.objects.create(minute=minute, gpu=gpu, workload=w, samples=60, util_avg=util, mem_max_mb=900)
    return w


def test_a_fraction_without_a_reading_is_billed_as_not_measurable_not_as_its_idle_minutes(user, catalog, api):
    RateCard.objects.filter(gpu_model="RTX3090").update(effective_from=timezone.now() - timedelta(days=1))
    node = make_node("sim:1xRTX3090")
    whole = ran_an_hour(user, node, name="whole", milli=1000, utils=[0.5, None, 0.5])  # None: a gap, left out
    # Under MPS: 0 while no process held the card, no reading while its process ran.
    half = ran_an_hour(user, node, name="half", milli=500, utils=[0.0, None, None])
    settle()
    lines = {line.name: line for line in statement(user_account(user), timezone.now().strftime("%Y-%m"))}
    assert lines["whole"].gpu_seconds_busy == pytest.approx(0.5 * 60 * 2) and not lines["whole"].busy_unmeasured
    assert lines["half"].gpu_seconds_busy is None, "not 0: the unread minutes are the ones it ran"
    assert lines["half"].busy_unmeasured and lines["half"].gpu_seconds_billed == pytest.approx(0.5 * 3600)
    assert (whole.pk, half.pk) == (lines["whole"].workload_id, lines["half"].workload_id)

    page = Client()
    page.force_login(user)
    html = page.get("/billing/").content.decode()
    assert html.count("data-busy-unmeasured") == 1
    assert "Per-tenant compute is not measurable on a shared card" in html
    rows = {r["name"]: r for r in csv.DictReader(io.StringIO(page.get("/billing/statement.csv").content.decode()))}
    assert rows["half"]["gpu_seconds_busy"] == "" and rows["half"]["note"] == BUSY_UNMEASURED
    assert rows["whole"]["gpu_seconds_busy"] == "60.0" and rows["whole"]["note"] == ""
    shown = {line["name"]: line for line in api.get("/api/v1/billing/statement/").json()}
    assert shown["half"]["gpu_seconds_busy"] is None and shown["half"]["busy_unmeasured"] is True
    assert shown["whole"]["busy_unmeasured"] is False
