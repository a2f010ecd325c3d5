"""What one sample of a node's GPUs holds, and the documents it is published as.

A backend (``nvml.py`` on a GPU host, ``simgpu.py`` elsewhere) reads each card
and attributes what it can to the tenants holding a share of it. The sampler
(``sampler.py``) turns a sample into one document for the node and one per
running workload, in the versioned compact shape the README documents
(``"v": 1``): short keys, SI-ish units (MiB, W, °C, MHz, KB/s), utilization
as a 0..1 fraction, ``null`` for what the card does not report. A tenant's
utilization that is ``null`` says why in ``util_absent`` (``UTIL_ABSENT``): on a
card shared through MPS the driver credits every client's SM time to the MPS
server, so a fraction's own compute is not measurable, and it is absent, never 0.
A backfill point (``charted``) is the same document with only what the charts draw.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from scheduler.policy.cluster import WHOLE_CARD

DOCUMENT_VERSION = 1

# Why a tenant's utilization is null (its ``util_absent``). Readers must never take an absent reading for idle.
SHARED_CARD = "shared-card"  # its processes are MPS clients: NVML lists the card's SM time under the MPS server only
NO_READING = "no-reading"  # the driver gave no per-process reading this sample (or none yet: a first sample)
UTIL_ABSENT = {SHARED_CARD: "per-tenant compute not measurable on a shared card", NO_READING: "no reading"}


@dataclass(frozen=True)
class Card:
    index: int
    uuid: str
    model: str
    memory_mb: int


@dataclass(frozen=True)
class TenantShare:
    """One running workload's hold on one card."""

    uuid: str
    milli: int  # thousandths of the card
    memory_mb: int  # its memory cap on that card


@dataclass(frozen=True)
class Tenant:
    workload_id: int
    uid: str
    name: str
    kind: str
    owner_id: int  # the agent's database role cannot read users: viewers resolve the name
    container_id: str
    cpu_cores: int
    memory_mb: int
    shares: tuple[TenantShare, ...]


@dataclass(frozen=True)
class ContainerUsage:
    cpu: float | None  # cores busy since the previous sample (None on the first one)
    memory_mb: int


@dataclass
class CardReading:
    index: int
    uuid: str
    model: str
    util: float | None  # SM (compute) utilization, 0..1
    mem_util: float | None = None  # memory-controller utilization, 0..1
    mem_used: int | None = None  # MiB
    mem_total: int | None = None
    temp: float | None = None  # °C
    power: float | None = None  # W
    power_limit: float | None = None
    sm_clock: int | None = None  # MHz
    mem_clock: int | None = None
    fan: int | None = None  # %
    pcie_rx: int | None = None  # KB/s
    pcie_tx: int | None = None
    ecc_dbe: int | None = None  # volatile double-bit ECC errors
    xid: int | None = None  # last XID error seen, where the driver reports one
    tenants: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class TenantReading:
    """A workload's own part of a card: its utilization of its share, its memory against its cap."""

    util: float | None  # of its share, 0..1 (a 0.3 share fully busy reads 1.0)
    mem_used: int | None  # MiB
    util_absent: str | None = None  # why ``util`` is None: a key of UTIL_ABSENT

    def __post_init__(self):
        if self.util is None and self.util_absent is None:
            object.__setattr__(self, "util_absent", NO_READING)


def tenant_holder(tenant: Tenant, share: TenantShare, reading: TenantReading | None) -> dict:
    """A tenant as the node document lists it under the card it holds a share of."""
    return {
        "workload": tenant.workload_id,
        "kind": tenant.kind,
        "name": tenant.name,
        "owner": tenant.owner_id,
        "share": share.milli / WHOLE_CARD,
        "util": _round(reading.util) if reading else None,
        "util_absent": reading.util_absent if reading else NO_READING,
        "mem_used": reading.mem_used if reading else None,
        "mem_cap": share.memory_mb,
    }


def node_document(*, t: float, node: str, simulated: bool, cards: list[CardReading]) -> dict:
    return {
        "v": DOCUMENT_VERSION,
        "t": round(t, 3),
        "node": node,
        "simulated": simulated,
        "gpus": [_compact(c) for c in cards],
    }


def workload_document(
    *,
    t: float,
    node: str,
    simulated: bool,
    tenant: Tenant,
    cards: dict[str, CardReading],
    readings: dict[str, TenantReading],
    usage: ContainerUsage | None,
) -> dict:
    gpus = []
    for share in tenant.shares:
        card = cards.get(share.uuid)
        own = readings.get(share.uuid)
        gpus.append(
            {
                "i": card.index if card else None,
                "uuid": share.uuid,
                "model": card.model if card else None,
                "share": share.milli / WHOLE_CARD,
                "util": _round(own.util) if own else None,
                "util_absent": own.util_absent if own else NO_READING,
                "mem_used": own.mem_used if own else None,
                "mem_cap": share.memory_mb,
                "card_util": _round(card.util) if card else None,
                "power": card.power if card else None,
                "temp": card.temp if card else None,
            }
        )
    return {
        "v": DOCUMENT_VERSION,
        "t": round(t, 3),
        "node": node,
        "simulated": simulated,
        "workload": tenant.workload_id,
        "cpu": _round(usage.cpu) if usage and usage.cpu is not None else None,
        "cpu_limit": tenant.cpu_cores,
        "mem_used": usage.memory_mb if usage else None,
        "mem_limit": tenant.memory_mb,
        "gpus": gpus,
    }


# What the monitor's charts draw of each card (instance_monitor.js): a backfill point keeps only these.
CHARTED_CARD_KEYS = (
    "i",
    "uuid",
    "share",
    "util",
    "util_absent",
    "card_util",
    "mem_used",
    "mem_cap",
    "mem_total",
    "power",
    "temp",
)


def charted(doc: dict) -> dict:
    """``doc`` cut to what a chart draws, for the backfill: a card's holders, clocks, PCIe and errors go."""
    return {**doc, "gpus": [{k: g[k] for k in CHARTED_CARD_KEYS if k in g} for g in doc["gpus"]]}


def _compact(card: CardReading) -> dict:
    doc = {k: v for k, v in asdict(card).items() if k not in ("index",)}
    doc["i"] = card.index
    for key in ("util", "mem_util"):
        doc[key] = _round(doc[key])
    return doc


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
