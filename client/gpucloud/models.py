"""Typed shapes of the API's answers. Each names the OpenAPI component it mirrors (``SCHEMA``); a test in the
server's suite checks every field here against the server's schema, so the two cannot drift apart silently.

Fields the server adds later are kept in ``raw`` (and shown by ``--json``); a field the
server drops fails that test, not a user's script.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import ClassVar


@dataclass
class Model:
    SCHEMA: ClassVar[str] = ""
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict):
        """``ValueError`` for what is not one: not an object, or without the model's first field (its id)."""
        names = cls.api_fields()
        if not isinstance(data, dict) or names[0] not in data:
            raise ValueError(f"a {cls.__name__} (an object with {names[0]!r})")
        return cls(**{k: v for k, v in data.items() if k in names}, raw=data)

    @classmethod
    def api_fields(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name != "raw"]


@dataclass
class GpuType(Model):
    SCHEMA: ClassVar[str] = "GpuTypeOutput"
    id: int = 0
    name: str = ""
    display_name: str = ""
    memory_gb: int = 0
    price_per_hour: str = "0"
    spot_price_per_hour: str | None = None
    spot_price_now: str | None = None
    currency: str = ""
    capacity: dict = field(default_factory=dict)

    @property
    def free_cards(self) -> int:
        return int(self.capacity.get("free_cards", 0))

    @property
    def spot_price(self) -> str | None:
        """The spot price now, or the rate card's when the platform has not computed one yet."""
        return self.spot_price_now or self.spot_price_per_hour


@dataclass
class Image(Model):
    SCHEMA: ClassVar[str] = "ImageOutput"
    id: int = 0
    name: str = ""
    framework: str = ""
    framework_version: str = ""
    docker_ref: str = ""
    visibility: str = ""
    status: str = ""
    status_reason: str = ""
    size_bytes: int | None = None
    created_at: str | None = None


@dataclass
class Job(Model):
    SCHEMA: ClassVar[str] = "JobOutput"
    FINISHED: ClassVar[frozenset] = frozenset({"succeeded", "failed", "stopped", "released"})
    id: int = 0
    name: str = ""
    status: str = ""
    status_reason: str = ""
    command: str = ""
    image: str = ""
    gpu_type: str = ""
    gpus: str = ""
    cards: int = 0
    elastic_min: int | None = None
    elastic_max: int | None = None
    cpu_cores: int = 0
    memory_gb: int = 0
    priority: str = ""
    node: str | None = None
    exit_code: int | None = None
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    preemptions: int = 0
    log_tail: str = ""

    @property
    def finished(self) -> bool:
        return self.status in self.FINISHED

    @property
    def size(self) -> str:
        """Its cards: as asked, or an elastic job's cards now and its range ("2 of 1-4")."""
        if self.elastic_min is None:
            return self.gpus
        return f"{self.cards} of {self.elastic_min}-{self.elastic_max}"


@dataclass
class Instance(Model):
    SCHEMA: ClassVar[str] = "InstanceOutput"
    id: int = 0
    name: str = ""
    status: str = ""
    status_reason: str = ""
    image: dict = field(default_factory=dict)
    gpu_type: str = ""
    gpus: str = ""
    cpu_cores: int = 0
    memory_gb: int = 0
    disk_gb: int = 0
    billing_mode: str = ""
    node: str | None = None
    created_at: str | None = None
    started_at: str | None = None


@dataclass
class FileEntry(Model):
    SCHEMA: ClassVar[str] = "EntryOutput"
    name: str = ""
    path: str = ""
    dir: bool = False
    link: bool = False
    size: int | None = None


@dataclass
class Account(Model):
    SCHEMA: ClassVar[str] = "AccountOutput"
    currency: str = ""
    balance: str = "0"
    unsettled: str = "0"
    available: str = "0"
    month_spend: str = "0"
    monthly_budget: str | None = None
    stops_at: str | None = None


@dataclass
class StatementLine(Model):
    SCHEMA: ClassVar[str] = "StatementLineOutput"
    name: str = ""
    kind: str = ""
    gpu_model: str = ""
    share: float = 0.0
    billing_mode: str = ""
    seconds: float = 0.0
    gpu_seconds_billed: float = 0.0
    amount: str = "0"


@dataclass
class ArrayJob(Model):
    """A job array (a sweep): POST /api/v1/arrays/ (the contract of issue 16)."""

    SCHEMA: ClassVar[str] = "ArrayOutput"
    FINISHED: ClassVar[frozenset] = frozenset({"done", "failed", "cancelled", "stopped"})
    id: int = 0
    name: str = ""
    status: str = ""
    status_reason: str = ""
    counts: dict = field(default_factory=dict)
    total: int = 0
    spot: bool = True
    cost: str = "0"
    currency: str = ""
    tasks: list = field(default_factory=list)


@dataclass
class LogLine:
    """One line of a workload's log: ``n`` is an opaque cursor, strictly increasing."""

    n: str
    t: str
    stream: str
    line: str
    rank: int | None = None  # a multi-node job's: the member's rank and host the line came from
    host: str = ""

    def shown(self) -> dict:
        """Its fields as the API gave them (rank and host only where it gave them)."""
        data = asdict(self)
        return data if self.rank is not None else {k: v for k, v in data.items() if k not in ("rank", "host")}


@dataclass
class LogEnd:
    """The log's last word: the workload's status, exit code and why it ended."""

    status: str = ""
    exit_code: int | None = None
    reason: str = ""
    cursor: str | None = None
    finished: bool = True


# What the SDK sends: request body fields, by the OpenAPI component that must hold each of them.
REQUESTS: dict[str, tuple[str, ...]] = {
    "JobCreateInput": (
        "name", "image", "gpu_type", "gpus", "cpu_cores", "memory_gb", "command", "priority", "max_runtime_s", "team",
        "env", "spot",
    ),
    "JobCreateForm": ("code",),
    "InstanceCreateInput": (
        "name", "image", "gpu_type", "gpus", "cpu_cores", "memory_gb", "disk_gb", "billing_mode", "team",
    ),
    "SaveImageInput": ("name",),
    "ArrayCreateInput": (
        "name", "image", "gpu_type", "gpus", "cpu_cores", "memory_gb", "command", "team", "env",
        "array", "params", "max_running", "spot", "fallback", "budget",
    ),
    "CredentialsInput": ("username", "password"),
}  # fmt: skip
RESPONSES: tuple[type[Model], ...] = (GpuType, Image, Job, Instance, FileEntry, Account, StatementLine)
