"""Simulated GPU readings for hosts without a GPU, driven by what the tenants' containers really do.

Each tenant's "GPU" activity on its share is its container's CPU activity:
one fully busy core reads 100 % (a process feeding a GPU keeps one core busy),
an idle container reads 0. Its GPU memory is its container's memory, up to its
cap. A card's utilization is the sum of its tenants' shares times their
activity; power rises linearly from idle to the card's limit with it;
temperature follows power with a lag of about half a minute; clocks and fan
follow utilization. Every document carries ``"simulated": true``.

What a tenant *reads* is what a real host would let it read (``nvml.py``): a
tenant holding whole cards reads its utilization; a fraction of a card runs as
an MPS client on a real host, where NVML gives no per-client compute, so here
too its utilization is absent (``SHARED_CARD``) while its memory and the card's
utilization are there. (A real card reads 0 for a fractional tenant with no
process on it; a simulated one cannot tell whether a container holds a GPU
context, so it never does.)
"""

from __future__ import annotations

import time

from scheduler.policy.cluster import WHOLE_CARD
from scheduler.telemetry.documents import (
    SHARED_CARD,
    Card,
    CardReading,
    ContainerUsage,
    Tenant,
    TenantReading,
    tenant_holder,
)

# Board power limits (W) of the models the simulated catalog knows; others get DEFAULT_POWER_W.
POWER_LIMIT_W = {
    "RTX3090": 350,
    "RTX4090": 450,
    "A5000": 230,
    "RTXA5000": 230,
    "RTXA6000": 300,
    "V100": 300,
    "P100": 250,
    "T4": 70,
    "L4": 72,
    "L40S": 350,
    "A10": 150,
    "A100": 400,
    "H100": 700,
    "H200": 700,
}
DEFAULT_POWER_W = 300
IDLE_POWER_FRACTION = 0.12
AMBIENT_C, FULL_LOAD_RISE_C, THERMAL_TAU_S = 32.0, 45.0, 30.0
SM_CLOCK_IDLE, SM_CLOCK_MAX, MEM_CLOCK = 210, 1710, 9501


def power_limit(model: str) -> int:
    for prefix, watts in POWER_LIMIT_W.items():
        if model == prefix or model.startswith(prefix + "-"):
            return watts
    return DEFAULT_POWER_W


class SimulatedBackend:
    simulated = True

    def __init__(self):
        self._temperature: dict[str, tuple[float, float]] = {}  # uuid -> (monotonic time, °C)

    def sample(
        self, cards: list[Card], tenants: list[Tenant], usage: dict[str, ContainerUsage]
    ) -> tuple[list[CardReading], dict[tuple[int, str], TenantReading]]:
        own: dict[tuple[int, str], TenantReading] = {}
        load = {c.uuid: 0.0 for c in cards}
        memory = {c.uuid: 0 for c in cards}
        holders: dict[str, list[dict]] = {c.uuid: [] for c in cards}
        for tenant in tenants:
            container = usage.get(tenant.container_id)
            busy = None if container is None or container.cpu is None else min(container.cpu, 1.0)
            for share in tenant.shares:
                if share.uuid not in load:
                    continue
                mem = None if container is None else min(container.memory_mb, share.memory_mb)
                # A fraction is an MPS client on a real host: its own compute is not measurable there either.
                seen = TenantReading(busy, mem) if share.milli >= WHOLE_CARD else TenantReading(None, mem, SHARED_CARD)
                reading = own[(tenant.workload_id, share.uuid)] = seen
                load[share.uuid] += (busy or 0.0) * share.milli / WHOLE_CARD
                memory[share.uuid] += mem or 0
                holders[share.uuid].append(tenant_holder(tenant, share, reading))
        return [self._card(c, min(load[c.uuid], 1.0), memory[c.uuid], holders[c.uuid]) for c in cards], own

    def _card(self, card: Card, util: float, mem_used: int, tenants: list[dict]) -> CardReading:
        limit = power_limit(card.model)
        power = limit * (IDLE_POWER_FRACTION + (1 - IDLE_POWER_FRACTION) * util)
        return CardReading(
            index=card.index,
            uuid=card.uuid,
            model=card.model,
            util=util,
            mem_util=round(util * 0.6, 4),
            mem_used=min(mem_used, card.memory_mb),
            mem_total=card.memory_mb,
            temp=round(self._temperature_after(card.uuid, power / limit), 1),
            power=round(power, 1),
            power_limit=float(limit),
            sm_clock=int(SM_CLOCK_IDLE + (SM_CLOCK_MAX - SM_CLOCK_IDLE) * min(util * 4, 1.0)),
            mem_clock=MEM_CLOCK,
            fan=int(30 + 50 * util),
            pcie_rx=0,
            pcie_tx=0,
            tenants=tenants,
        )

    def _temperature_after(self, uuid: str, load: float) -> float:
        target = AMBIENT_C + FULL_LOAD_RISE_C * load
        now = time.monotonic()
        then, current = self._temperature.get(uuid, (now, target))
        step = min((now - then) / THERMAL_TAU_S, 1.0)
        current += (target - current) * step
        self._temperature[uuid] = (now, current)
        return current
