"""``/metrics``: Prometheus text with dcgm-exporter's metric names, plus the scheduler's gauges.

Per card, the series dcgm-exporter exports, with its labels (``gpu``, ``UUID``,
``device``, ``modelName``, ``Hostname``), so its Grafana dashboards work
unchanged; ``simulated="true"`` marks cards without a real GPU. Per tenant of
a card, the same names with the Kubernetes labels dcgm-exporter adds for a
pod (``pod`` = the instance or job name, ``namespace`` = its owner,
``container``) and ``gpucloud_instance`` / ``gpucloud_owner`` — but, unlike
dcgm-exporter on a shared card, each tenant's series carry its *own* share:
utilization of its share (%), its own framebuffer memory, free memory up to
its cap. Temperature, power and clocks are the card's.

A tenant whose own utilization is absent (a fraction of a card shared through
MPS: NVML gives no per-client compute, ``agent.telemetry.nvml``) has no
``DCGM_FI_DEV_GPU_UTIL`` series, never a 0; ``gpucloud_tenant_util_measured``
says which tenants have one (1) and why the others do not (0, ``reason``:
``shared-card``, ``no-reading``). Its memory series are there.

Values come from each node's latest sample in Redis; a node silent for
``STALE_AFTER_S`` exports nothing rather than old numbers. Scraping needs
``Authorization: Bearer <METRICS_TOKEN>`` (or a staff session).
"""

from __future__ import annotations

import secrets
import time

from django.conf import settings
from django.db.models import Count, Sum
from django.http import HttpResponse
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from scheduler.models import Gpu, Node, NodeStatus, Workload, WorkloadStatus
from scheduler.policy.cluster import WHOLE_CARD
from scheduler.telemetry import streams
from scheduler.telemetry.documents import NO_READING

STALE_AFTER_S = 30


def _percent(value):
    return None if value is None else value * 100


# name, help, how to read it from a card (node document) and from a tenant of the card
CARD_METRICS = [
    (
        "DCGM_FI_DEV_GPU_UTIL",
        "GPU utilization (in %).",
        lambda c: _percent(c["util"]),
        lambda t, c: _percent(t["util"]),
    ),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda c: _percent(c["mem_util"]), lambda t, c: None),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda c: c["mem_used"], lambda t, c: t["mem_used"]),
    (
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        lambda c: None if c["mem_used"] is None or c["mem_total"] is None else c["mem_total"] - c["mem_used"],
        lambda t, c: None if t["mem_used"] is None else max(t["mem_cap"] - t["mem_used"], 0),
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda c: c["temp"], lambda t, c: c["temp"]),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda c: c["power"], lambda t, c: c["power"]),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).", lambda c: c["power_limit"], None),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda c: c["sm_clock"], lambda t, c: c["sm_clock"]),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", lambda c: c["mem_clock"], None),
    ("DCGM_FI_DEV_FAN_SPEED", "Fan speed (in %).", lambda c: c["fan"], None),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "The rate of data received over the PCIe bus (in B/s).",
        lambda c: None if c["pcie_rx"] is None else c["pcie_rx"] * 1024,
        None,
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "The rate of data transmitted over the PCIe bus (in B/s).",
        lambda c: None if c["pcie_tx"] is None else c["pcie_tx"] * 1024,
        None,
    ),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", lambda c: c["xid"], None),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", lambda c: c["ecc_dbe"], None),
]
CARD_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "simulated"]
TENANT_LABELS = CARD_LABELS + ["pod", "namespace", "container", "gpucloud_instance", "gpucloud_owner"]


class ClusterCollector:
    """Reads the latest samples and the scheduler's state at scrape time."""

    def collect(self):
        yield from self._gpus()
        yield from self._scheduler()

    def _fresh(self) -> list[dict]:
        names = list(Node.objects.values_list("name", flat=True))
        latest = streams.latest_node_documents(names)
        return [d for d in latest.values() if time.time() - d["t"] <= STALE_AFTER_S]

    def _gpus(self):
        fresh = self._fresh()
        workloads = _tenant_names(fresh)
        families = []
        for name, help_text, of_card, of_tenant in CARD_METRICS:
            family = GaugeMetricFamily(name, help_text, labels=TENANT_LABELS)
            for doc in fresh:
                for card in doc["gpus"]:
                    base = _card_labels(doc, card)
                    _add(family, base + [""] * 5, of_card(card))
                    if of_tenant is None:
                        continue
                    for tenant in card["tenants"]:
                        _add(family, base + _tenant_labels(tenant, workloads), of_tenant(tenant, card))
            families.append(family)
        measured = GaugeMetricFamily(
            "gpucloud_tenant_util_measured",
            "1: the tenant's own utilization is exported (DCGM_FI_DEV_GPU_UTIL); 0: absent, and why (reason: "
            "shared-card, per-tenant compute not measurable on a card shared through MPS; no-reading).",
            labels=TENANT_LABELS + ["reason"],
        )
        for doc in fresh:
            for card in doc["gpus"]:
                for tenant in card["tenants"]:
                    absent = (tenant.get("util_absent") or NO_READING) if tenant["util"] is None else ""
                    labels = _card_labels(doc, card) + _tenant_labels(tenant, workloads) + [absent]
                    measured.add_metric(labels, 0.0 if tenant["util"] is None else 1.0)
        return [*families, measured]

    def _scheduler(self):
        queued = GaugeMetricFamily(
            "gpucloud_queued_workloads", "Work waiting for GPUs, per MLFQ queue level.", labels=["queue_level"]
        )
        waiting = Workload.objects.filter(status=WorkloadStatus.QUEUED).values("queue_level").annotate(n=Count("id"))
        for row in waiting:
            queued.add_metric([str(row["queue_level"])], row["n"])
        running = GaugeMetricFamily("gpucloud_running_workloads", "Work running, per kind.", labels=["kind"])
        for row in Workload.objects.filter(status=WorkloadStatus.RUNNING).values("kind").annotate(n=Count("id")):
            running.add_metric([row["kind"]], row["n"])
        cards = GaugeMetricFamily("gpucloud_gpu_cards", "Cards on active nodes, per GPU type.", labels=["gpu_model"])
        allocated = GaugeMetricFamily(
            "gpucloud_gpu_allocated_share", "Cards' worth of GPU share held, per GPU type.", labels=["gpu_model"]
        )
        per_model = (
            Gpu.objects.filter(node__status=NodeStatus.ACTIVE)
            .values("model")
            .annotate(n=Count("id"), milli=Sum("allocated_milli"))
        )
        for row in per_model:
            cards.add_metric([row["model"]], row["n"])
            allocated.add_metric([row["model"]], (row["milli"] or 0) / WHOLE_CARD)
        nodes = GaugeMetricFamily("gpucloud_nodes", "Nodes, per status.", labels=["status"])
        for row in Node.objects.values("status").annotate(n=Count("id")):
            nodes.add_metric([row["status"]], row["n"])
        return [queued, running, cards, allocated, nodes]


def _card_labels(doc: dict, card: dict) -> list[str]:
    return [
        str(card["i"]),
        card["uuid"],
        f"nvidia{card['i']}",
        f"NVIDIA {card['model']}",
        doc["node"],
        "true" if doc["simulated"] else "false",
    ]


def _tenant_names(docs) -> dict[int, tuple[str, str, str]]:
    """workload id -> (gpucloud_instance label, container name, owner), for the tenants in these documents."""
    ids = {t["workload"] for doc in docs for card in doc["gpus"] for t in card["tenants"]}
    names = {}
    for w in Workload.objects.filter(pk__in=ids).select_related("instance", "job", "owner"):
        portal_object = getattr(w, w.kind, None)
        label = f"{w.kind}-{portal_object.pk}" if portal_object is not None else f"workload-{w.pk}"
        names[w.pk] = (label, w.container_name, w.owner.username)
    return names


def _tenant_labels(tenant: dict, names: dict[int, tuple[str, str, str]]) -> list[str]:
    fallback = (f"workload-{tenant['workload']}", "", f"user-{tenant['owner']}")
    label, container, owner = names.get(tenant["workload"], fallback)
    return [tenant["name"], owner, container, label, owner]


def _add(family: GaugeMetricFamily, labels: list[str], value) -> None:
    if value is not None:
        family.add_metric(labels, float(value))


def _authorized(request) -> bool:
    header = request.headers.get("Authorization", "")
    token = settings.METRICS_TOKEN
    if token and header.startswith("Bearer ") and secrets.compare_digest(header[7:].encode(), token.encode()):
        return True
    return request.user.is_authenticated and request.user.is_staff


@require_safe
def metrics(request):
    if not _authorized(request):
        response = HttpResponse("a bearer token (METRICS_TOKEN) or a staff session is needed\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
