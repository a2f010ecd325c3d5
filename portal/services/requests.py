"""What a user asks for, once: the API's serializers and the console's forms build these, the services take them.

Each field is named as users know it (``gpus``, ``memory_gb``, ``gpu_type_id``); the services check the values
(bounds, catalog, money) and turn them into the scheduler's view (``gpu_count``/``gpu_milli``, ``memory_mb``).
An unknown field is a ``TypeError`` where the request is built, never a keyword silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from decimal import Decimal

from portal import limits
from portal.models import BillingMode, Fallback
from scheduler.models import Priority


@dataclass(frozen=True, kw_only=True)
class WorkRequest:
    """What instances, jobs and arrays ask for alike: an image, a GPU type and cards, CPU and memory, a payer."""

    owner: object
    name: str
    image_id: int
    gpu_type_id: int
    gpus: Decimal
    cpu_cores: int = limits.DEFAULT_CPU_CORES
    memory_gb: int = limits.DEFAULT_MEMORY_GB
    team: str = ""  # a team's slug: charged to the team's wallet ("" for the owner's own)

    @classmethod
    def of(cls, owner, values: dict):
        """The request from an interface's validated values (a form's ``cleaned_data``, a serializer's data):
        ``image`` and ``gpu_type`` name their ids, a priority may be its name ("high")."""
        values = dict(values)
        if "image" in values:
            values["image_id"] = values.pop("image")
        if "gpu_type" in values:
            values["gpu_type_id"] = values.pop("gpu_type")
        if isinstance(values.get("priority"), str):
            values["priority"] = Priority[values["priority"].upper()].value
        return cls(owner=owner, **values)

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}


@dataclass(frozen=True, kw_only=True)
class InstanceRequest(WorkRequest):
    """An instance: a data disk, on-demand or spot billing, an optional idle stop and stop time."""

    disk_gb: int = 50
    billing_mode: str = BillingMode.ON_DEMAND
    idle_util_percent: int | None = None  # stop when the GPU stays below it ...
    idle_minutes: int | None = limits.DEFAULT_IDLE_MINUTES  # ... for this long (None: the default)
    stop_at: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class JobRequest(WorkRequest):
    """A batch job: its command and environment, priority and limits; over several nodes (``nodes``) or
    elastic (``elastic_min``..``elastic_max`` cards around ``gpus``)."""

    command: str
    priority: int = Priority.NORMAL
    max_runtime_s: int | None = None
    checkpoint_gb: int = 50
    env: dict = field(default_factory=dict)
    spot: bool = False
    nodes: int | None = None
    elastic_min: int | None = None
    elastic_max: int | None = None


@dataclass(frozen=True, kw_only=True)
class ArrayRequest(JobRequest):
    """A job array (sweep): one task per index of ``array`` or per point of ``params``, each a job of this shape
    on one node; spot by default, with a fallback to on-demand, a deadline and a budget."""

    array: str | None = None
    params: dict | None = None
    max_running: int | None = None
    spot: bool = True
    fallback: str = Fallback.NONE
    max_preemptions: int = 3
    deadline: datetime | None = None
    budget: Decimal | None = None
