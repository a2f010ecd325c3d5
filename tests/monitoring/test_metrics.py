"""/metrics: dcgm-exporter's names per card, each tenant's own share, scheduler gauges, a token."""

import json
import time
from decimal import Decimal

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from portal.services import work
from portal.services.requests import InstanceRequest
from scheduler.telemetry import streams
from scheduler.telemetry.documents import (
    SHARED_CARD,
    CardReading,
    Tenant,
    TenantReading,
    TenantShare,
    node_document,
    tenant_holder,
)
from tests.conftest import make_node

pytestmark = pytest.mark.django_db
TOKEN = "metrics-token-0123456789"


def instance_of(user, catalog, name: str, gpus: str):
    return work.instance_create(
        InstanceRequest(
            owner=user,
            name=name,
            image_id=catalog["image"].pk,
            gpu_type_id=catalog["rtx3090"].pk,
            gpus=Decimal(gpus),
            cpu_cores=1,
            memory_gb=1,
            disk_gb=10,
        )
    )


def held(instance, user, share: TenantShare, reading: TenantReading) -> dict:
    w = instance.workload
    return tenant_holder(Tenant(w.pk, w.uid, w.name, w.kind, user.pk, "c" * 64, 1, 1024, (share,)), share, reading)


@pytest.fixture
def sampled(settings, user, catalog):
    """A node whose latest sample has a card half held by one instance, busy on its whole share (a card without
    MPS: its own compute read), and a card shared through MPS by another (its own compute absent)."""
    settings.METRICS_TOKEN = TOKEN
    node = make_node("sim:2xRTX3090")
    card, spare = node.gpus.order_by("index")
    instance = instance_of(user, catalog, "train", "0.5")
    reading = CardReading(0, card.uuid, "RTX3090", util=0.5, mem_used=5000, mem_total=24576, temp=61.0, power=200.0)
    reading.tenants.append(held(instance, user, TenantShare(card.uuid, 500, 12288), TenantReading(1.0, 3000)))
    shared = CardReading(1, spare.uuid, "RTX3090", util=0.9, mem_used=8000, mem_total=24576, temp=35.0, power=40.0)
    mps = held(
        instance_of(user, catalog, "mps", "0.2"),
        user,
        TenantShare(spare.uuid, 200, 4915),
        TenantReading(None, 6000, SHARED_CARD),
    )
    shared.tenants.append(mps)
    doc = node_document(t=time.time(), node=node.name, simulated=True, cards=[reading, shared])
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
    assert queued == {"0": 2.0}
    assert ({"gpu_model": "RTX3090"}, 2.0) in series["gpucloud_gpu_cards"]


def test_a_tenant_whose_own_compute_is_not_measurable_has_no_utilization_series_and_a_marker(sampled):
    node, instance, card = sampled
    series = scrape(Authorization=f"Bearer {TOKEN}")
    util = {(labels["gpu"], labels["pod"]): value for labels, value in series["DCGM_FI_DEV_GPU_UTIL"]}
    assert util[("1", "")] == 90.0, "the shared card's own utilization stays"
    assert ("1", "mps") not in util, "absent, not 0"
    assert {(lb["pod"], v) for lb, v in series["DCGM_FI_DEV_FB_USED"] if lb["gpu"] == "1"} == {
        ("", 8000),
        ("mps", 6000),
    }
    marker = {lb["pod"]: (v, lb["reason"]) for lb, v in series["gpucloud_tenant_util_measured"]}
    assert marker == {"train": (1.0, ""), "mps": (0.0, "shared-card")}


def test_a_silent_node_exports_no_stale_numbers(sampled, monkeypatch):
    monkeypatch.setattr(time, "time", lambda real=time.time: real() + 3600)
    assert "DCGM_FI_DEV_GPU_UTIL" not in scrape(Authorization=f"Bearer {TOKEN}")


@pytest.mark.parametrize("header", [None, "Bearer wrong-token", f"Token {TOKEN}"])
def test_scraping_without_the_token_is_refused(sampled, header):
    response = Client().get("/metrics", headers={"Authorization": header} if header else {})
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")
