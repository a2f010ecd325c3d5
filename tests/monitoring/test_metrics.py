"""/metrics: dcgm-exporter's names per card, each tenant's own share, scheduler gauges, a token."""

import json
import time
from decimal import Decimal

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from portal.services import work
from scheduler.telemetry import streams
from scheduler.telemetry.documents import CardReading, Tenant, TenantReading, TenantShare, node_document, tenant_holder
from tests.conftest import make_node

pytestmark = pytest.mark.django_db
TOKEN = "metrics-token-0123456789"


@pytest.fixture
def sampled(settings, user, catalog):
    """A node whose latest sample has a card half held by one instance, busy on its whole share."""
    settings.METRICS_TOKEN = TOKEN
    node = make_node("sim:2xRTX3090")
    card, spare = node.gpus.order_by("index")
    instance = work.instance_create(
        owner=user,
        name="train",
        image_id=catalog["image"].pk,
        gpu_type_id=catalog["rtx3090"].pk,
        gpus=Decimal("0.5"),
        cpu_cores=1,
        memory_gb=1,
        disk_gb=10,
    )
    w = instance.workload
    share = TenantShare(card.uuid, 500, 12288)
    tenant = Tenant(w.pk, w.uid, w.name, w.kind, user.pk, "c" * 64, 1, 1024, (share,))
    reading = CardReading(0, card.uuid, "RTX3090", util=0.5, mem_used=5000, mem_total=24576, temp=61.0, power=200.0)
    reading.tenants.append(tenant_holder(tenant, share, TenantReading(1.0, 3000)))
    idle = CardReading(1, spare.uuid, "RTX3090", util=0.0, mem_used=0, mem_total=24576, temp=35.0, power=40.0)
    doc = node_document(t=time.time(), node=node.name, simulated=True, cards=[reading, idle])
    streams.history_append([(streams.node_stream(node.name), json.dumps(doc), None)])
    return node, instance, card


def scrape(client=None, **headers) -> dict:
    response = (client or Client()).get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    series = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            series.setdefault(s.name, []).append((s.labels, s.value))
    return series


def test_cards_export_dcgm_exporter_series_and_tenants_their_own_share(sampled, user):
    node, instance, card = sampled
    series = scrape(Authorization=f"Bearer {TOKEN}")
    util = {(labels["UUID"], labels["pod"]): value for labels, value in series["DCGM_FI_DEV_GPU_UTIL"]}
    assert util[(card.uuid, "")] == 50.0, "the card as a whole"
    assert util[(card.uuid, "train")] == 100.0, "the tenant's own share, not the card's 50 %"
    [(labels, free)] = [(lb, v) for lb, v in series["DCGM_FI_DEV_FB_FREE"] if lb["pod"] == "train"]
    assert free == 12288 - 3000
    assert labels["gpucloud_instance"] == f"instance-{instance.pk}" and labels["gpucloud_owner"] == user.username
    assert labels["namespace"] == user.username and labels["container"] == instance.workload.container_name
    assert (labels["gpu"], labels["device"], labels["modelName"], labels["Hostname"]) == (
        "0",
        "nvidia0",
        "NVIDIA RTX3090",
        node.name,
    )
    assert labels["simulated"] == "true"
    assert {lb["gpu"] for lb, _ in series["DCGM_FI_DEV_POWER_USAGE"] if lb["pod"] == ""} == {"0", "1"}
    queued = {lb["queue_level"]: v for lb, v in series["gpucloud_queued_workloads"]}
    assert queued == {"0": 1.0}
    assert ({"gpu_model": "RTX3090"}, 2.0) in series["gpucloud_gpu_cards"]


def test_a_silent_node_exports_no_stale_numbers(sampled, monkeypatch):
    monkeypatch.setattr(time, "time", lambda real=time.time: real() + 3600)
    assert "DCGM_FI_DEV_GPU_UTIL" not in scrape(Authorization=f"Bearer {TOKEN}")


@pytest.mark.parametrize("header", [None, "Bearer wrong-token", f"Token {TOKEN}"])
def test_scraping_without_the_token_is_refused(sampled, header):
    response = Client().get("/metrics", headers={"Authorization": header} if header else {})
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")
