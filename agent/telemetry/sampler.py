"""The node agent's sampling loop: read the cards, publish, keep history, fold minutes.

Every ``TELEMETRY_INTERVAL_S`` (1 s by default, 0.25 s at the least) the
sampler reads which workloads run here (the database), their containers' CPU
and memory (``cgroups.py``) and the cards (NVML or the simulated backend),
then publishes one document for the node and one per workload to their
channel-layer groups, appends them to the Redis history, and adds them to the
minute rollups it writes when each minute ends. A failed sample is a logged
gap: the loop goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import close_old_connections
from django.db.models import Prefetch

from agent.telemetry.cgroups import UsageReader
from agent.telemetry.rollups import MinuteRollups
from core import messages
from scheduler.models import Allocation, Gpu, Node, Workload, WorkloadStatus
from scheduler.telemetry import streams
from scheduler.telemetry.documents import Card, Tenant, TenantShare, charted, node_document, workload_document

log = logging.getLogger(__name__)


def _dumps(doc: dict) -> str:
    return json.dumps(doc, separators=(",", ":"))


def node_cards(node_name: str) -> list[Card]:
    gpus = Gpu.objects.filter(node__name=node_name).order_by("index")
    return [Card(g.index, g.uuid, g.model, g.memory_mb) for g in gpus]


def node_tenants(node_name: str) -> list[Tenant]:
    running = Workload.objects.filter(node__name=node_name, status=WorkloadStatus.RUNNING).prefetch_related(
        Prefetch("allocations", Allocation.objects.select_related("gpu").order_by("gpu__index"))
    )
    return [
        Tenant(
            workload_id=w.pk,
            uid=w.uid,
            name=w.name,
            kind=w.kind,
            owner_id=w.owner_id,
            container_id=w.container_id,
            cpu_cores=w.cpu_cores,
            memory_mb=w.memory_mb,
            shares=tuple(TenantShare(a.gpu.uuid, a.milli, a.memory_mb) for a in w.allocations.all()),
        )
        for w in running
    ]


class Sampler:
    def __init__(self, node: Node, *, backend, docker_client, clock=time.time):
        """``clock``: Unix time now; the agent passes the database's clock (``AgentClock.time``) so that
        samples and minutes line up with the control plane's, whatever this host's own clock says."""
        self.node_name = node.name
        self.clock = clock
        self.simulated = node.simulated
        self.cards = node_cards(node.name)
        self.backend = backend
        self.usage = UsageReader(docker_client)
        self.rollups = MinuteRollups()
        self._loop = asyncio.new_event_loop()  # the channel layer's connections live on this loop
        self._layer = get_channel_layer()

    def sample_once(self) -> dict:
        """Take one sample, publish it and fold it in; returns the node document."""
        t = self.clock()
        tenants = node_tenants(self.node_name)
        usage = self.usage.read([x.container_id for x in tenants if x.container_id])
        cards, own = self.backend.sample(self.cards, tenants, usage)
        by_uuid = {c.uuid: c for c in cards}
        doc = node_document(t=t, node=self.node_name, simulated=self.simulated, cards=cards)
        outgoing = [(messages.node_group(self.node_name), streams.node_stream(self.node_name), doc)]
        for tenant in tenants:
            tenant_doc = workload_document(
                t=t,
                node=self.node_name,
                simulated=self.simulated,
                tenant=tenant,
                cards=by_uuid,
                readings={uuid: r for (w, uuid), r in own.items() if w == tenant.workload_id},
                usage=usage.get(tenant.container_id),
            )
            group = messages.workload_group(self.node_name, tenant.workload_id)
            outgoing.append((group, streams.workload_stream(self.node_name, tenant.workload_id), tenant_doc))
        point = streams.backfill_due(t)  # the first sample of a backfill step: also kept, cut, as a point
        # Serialized once: the history and every viewer get these bytes.
        texts = [(group, stream, _dumps(d), _dumps(charted(d)) if point else None) for group, stream, d in outgoing]
        streams.history_append([(stream, text, cut) for _, stream, text, cut in texts])
        self._loop.run_until_complete(self._publish([(group, text) for group, _, text, _ in texts]))
        self.rollups.add(t, cards, own)
        return doc

    async def _publish(self, outgoing: list[tuple[str, str]]) -> None:
        # One after the other: concurrent sends for a node with many tenants run out of the
        # layer's Redis connections (measured in bench/ws_fanout.py), and each takes ~1-2 ms.
        for group, text in outgoing:
            await self._layer.group_send(group, {"type": messages.TELEMETRY_SAMPLE, "doc": text})

    def run_forever(self, stop: threading.Event) -> None:
        interval = settings.TELEMETRY_INTERVAL_S
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                self.sample_once()
                self.rollups.flush(self.clock())
            except Exception:  # Redis, the database or the driver away for a moment: a gap in the charts
                log.exception("GPU sample on %s failed", self.node_name)
            finally:
                close_old_connections()
            next_at += interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (a slow sample): skip the missed ticks rather than burst
                next_at, delay = time.monotonic(), 0
            stop.wait(delay)
        self.close()

    def close(self) -> None:
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()
        self._loop.close()


def sampler_for(node: Node, docker_client, *, clock=time.time) -> Sampler:
    if node.simulated:
        from agent.telemetry.simgpu import SimulatedBackend

        backend = SimulatedBackend()
    else:
        from agent.telemetry.nvml import NvmlBackend

        backend = NvmlBackend(node_cards(node.name), pcie=settings.TELEMETRY_NVML_PCIE)
    return Sampler(node, backend=backend, docker_client=docker_client, clock=clock)
