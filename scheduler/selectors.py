"""Reads of cluster state: free capacity as policy objects, and what exists at all."""

from collections import Counter, defaultdict

from django.conf import settings
from django.db import connection
from django.db.models import (
    Avg,
    BigIntegerField,
    BooleanField,
    Case,
    Count,
    F,
    FloatField,
    Func,
    IntegerField,
    Prefetch,
    Q,
    Sum,
    Value,
    When,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast, Coalesce

from core.pg_arrays import int_array
from scheduler.models import (
    ENDED_JOB,
    Allocation,
    DiskDelta,
    Gpu,
    Move,
    MoveStatus,
    Node,
    NodeStatus,
    Workload,
    WorkloadGpuMinute,
    WorkloadKind,
    WorkloadMember,
    WorkloadStatus,
)
from scheduler.policy import CardSpec, NodeSpec
from scheduler.policy.cluster import WHOLE_CARD, share_class_of
from scheduler.policy.predict import DurationHistory


def cluster_capacity() -> list[NodeSpec]:
    """Free capacity of every active node, as plain objects for the policy (ids are primary keys), each card with
    its share class. A node whose disk is full (below NODE_DISK_MIN_FREE_GB free at its last heartbeat) takes
    nothing new, as if draining; a node that registered what it offers tenants' disks (``Node.disk_gb``) has
    that less ``disk_held`` free.

    Read as rows, not model objects: every tick reads every card (8,000 on 1,000 nodes)."""
    nodes = capacity_nodes()
    for node_id, _, card in card_specs(nodes):
        nodes[node_id].cards.append(card)
    return list(nodes.values())


def capacity_nodes() -> dict[int, NodeSpec]:
    """The active nodes that may take work, by id, as ``cluster_capacity`` has them but without their cards."""
    roomy = Q(disk_free_gb__isnull=True) | Q(disk_free_gb__gte=settings.NODE_DISK_MIN_FREE_GB)
    active = Node.objects.filter(roomy, status=NodeStatus.ACTIVE).order_by("pk")
    rows = active.values_list("pk", "name", "cpu_cores", "allocated_cpu", "memory_mb", "allocated_memory_mb", "disk_gb")
    nodes, offered = {}, {}
    for pk, name, cpu, cpu_held, memory, memory_held, disk in rows:
        nodes[pk] = NodeSpec(pk, cpu - cpu_held, memory - memory_held, name=name)
        if disk is not None:
            offered[pk] = disk
    held = disk_held() if offered else {}
    for pk, disk in offered.items():
        nodes[pk].disk_free_gb = disk - held.get(pk, 0)
    return nodes


def card_specs(nodes, *, written_since: int | None = None, of_nodes: list[int] = ()) -> list:
    """The cards of ``nodes`` (ids) as (node id, index, ``CardSpec`` with its share class) in (node, index) order.
    The nodes are kept in Python: a filter by an array of 1,000 node ids compares each row with each id (11 ms).

    ``written_since`` (PostgreSQL, ``scheduler.holding``): only the cards whose row version was written by a
    transaction numbered that or later (the low 32 bits of the transaction id), and those of the nodes
    ``of_nodes`` whatever their version.

    The share class is the size of the fractions allocated on the card (one size per card, ``policy.cluster``),
    read apart from its free share, so the two may disagree by a placement or a stop; the allocation service
    re-checks both under its locks."""
    cards = Gpu.objects.order_by("node_id", "index")
    if written_since is not None:
        since = Q(RawSQL("scheduler_gpu.xmin::text::bigint >= %s", (written_since,), output_field=BooleanField()))
        cards = cards.filter(since | Q(id_in("scheduler_gpu.node_id", of_nodes)) if of_nodes else since)
    columns = ["pk", "node_id", "index", "model", "memory_mb", "allocated_milli", "allocated_memory_mb"]
    rows = [row for row in cards.values_list(*columns) if row[1] in nodes]
    fractions: dict[int, list[int]] = defaultdict(list)
    busy = [row[0] for row in rows if row[5] > 0]  # only these may hold fractions
    if busy:
        held = Allocation.objects.filter(id_in("scheduler_allocation.gpu_id", busy), milli__lt=WHOLE_CARD)
        for gpu_id, milli in held.values_list("gpu_id", "milli").distinct():
            fractions[gpu_id].append(milli)
    specs = []
    for pk, node_id, index, model, memory, milli_held, memory_held in rows:
        share_class = share_class_of(fractions.get(pk, ()))
        card = CardSpec(pk, model, memory, WHOLE_CARD - milli_held, memory - memory_held, share_class)
        specs.append((node_id, index, card))
    return specs


def disk_reserved_gb(disk_gb: int, *, container: bool = True) -> int:
    """GB one workload reserves on each host it has disks on: its data disk, and its system disk (the container's
    writable layer) while it has a container there — an ended job has none, its data disk stays until released."""
    return disk_gb + (settings.INSTANCE_SYSTEM_DISK_GB if container else 0)


def disk_held(node_ids: list[int] | None = None) -> dict[int, int]:
    """GB reserved by tenants' disks on each of these nodes (every one listed, 0 where none); None: on every node
    that holds any (one pass, no list of ids: what the tick reads).

    Every workload not released holds its disks (``disk_reserved_gb``) on the node it runs or last ran on (its
    ``node``, or the ``pinned_node`` it returns to): a stopped instance's, an ended job's files; queued work only
    where it must return. A placed gang's other members hold theirs on their nodes, an instance
    being moved its copy on the target. A job requeued to run anywhere is not counted where it ran before; what
    it left there is covered by the host's measured free space (NODE_DISK_MIN_FREE_GB). On PostgreSQL the
    workloads' own part is kept per node by a trigger (``_workloads_disk``), not summed over their rows. The three
    parts are one statement (a union): the tick reads them twice, once under the placements' node locks."""
    held = dict.fromkeys(node_ids or (), 0)
    if node_ids is not None and not node_ids:
        return held
    everywhere = node_ids is None
    container = Value(1, output_field=IntegerField())  # as (node, data disk GB, containers): one container each
    members = WorkloadMember.objects.filter(rank__gt=0, workload__status__in=WorkloadStatus.holding_resources())
    moving = Move.objects.filter(status=MoveStatus.COPYING)  # the copy being made on the target
    if not everywhere:
        members = members.filter(id_in("scheduler_workloadmember.node_id", node_ids))
        moving = moving.filter(id_in("scheduler_move.target_id", node_ids))
    parts = _workloads_disk(node_ids).union(
        members.order_by().values_list("node_id", "workload__disk_gb", container),
        moving.order_by().values_list("target_id", "workload__disk_gb", container),
        all=True,
    )
    system_disk = disk_reserved_gb(0)  # a container's
    for node_id, gb, containers in driver_rows(parts):
        if everywhere or node_id in held:
            held[node_id] = held.get(node_id, 0) + gb + containers * system_disk
    return held


def driver_rows(query) -> list[tuple]:
    """The rows of a ``values_list`` query as the database driver gives them, for columns Django would not convert
    (integers, text): its converters, run on each value, took ~1 ms of every tick for the ~1,000 rows of the disk
    held (``disk_held``), and its row iteration ~1 ms for the 5,000 holding rows' versions (``scheduler.holding``)."""
    sql, params = query.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _workloads_disk(node_ids: list[int] | None):
    """(node, data disks' GB, containers) the workloads themselves hold on each of these nodes (None: on every
    node), a query: on PostgreSQL the sums of ``DiskDelta`` (kept by a trigger, migration 0030), elsewhere of the
    rows."""
    return _disk_deltas(node_ids) if connection.vendor == "postgresql" else _disk_summed(node_ids)


def _disk_deltas(node_ids: list[int] | None):
    deltas = DiskDelta.objects.order_by()
    if node_ids is not None:
        deltas = deltas.filter(id_in("scheduler_diskdelta.node_id", node_ids))
    # Sums of bigint columns are numeric in PostgreSQL: cast back, so the driver gives ints (``driver_rows``).
    sums = deltas.values("node_id").annotate(
        gb=Cast(Sum("gb"), BigIntegerField()), containers=Cast(Sum("containers"), BigIntegerField())
    )
    return sums.values_list("node_id", "gb", "containers")


def _disk_summed(node_ids: list[int] | None):
    """The workloads' disks summed from their rows: each counts on its ``home`` (queued work only where it must
    return), a container's system disk unless it is an ended job. The trigger spells the same rule out."""
    home = Case(
        When(status=WorkloadStatus.QUEUED, then=F("pinned_node_id")), default=Coalesce("node_id", "pinned_node_id")
    )
    counted = Workload.objects.exclude(status=WorkloadStatus.RELEASED).annotate(home=home).filter(home__isnull=False)
    if node_ids is not None:
        counted = counted.filter(home__in=node_ids)
    container = Case(When(ENDED_JOB, then=0), default=1)
    sums = counted.order_by().values("home").annotate(gb=Sum("disk_gb"), containers=Sum(container))
    return sums.values_list("home", "gb", "containers")


def disk_room(node: Node) -> int | None:
    """GB the node's tenants' disks may still reserve (``Node.disk_gb`` less ``disk_held``); None: not counted.
    Exact only while the caller holds the node's row lock (placements, moves and disk growths take it)."""
    if node.disk_gb is None:
        return None
    return node.disk_gb - disk_held([node.pk])[node.pk]


class EpochSeconds(Func):
    """A timestamp as seconds since 1970, a float (NULL stays None).

    Django parses each timestamp PostgreSQL sends in Python: for the tick's 5,000 holding rows that was
    ~25 ms a column, where a float column costs ~3 ms."""

    output_field = FloatField()
    template = "EXTRACT(EPOCH FROM %(expressions)s)::double precision"

    def as_sqlite(self, compiler, connection, **extra_context):
        template = "((julianday(%(expressions)s) - 2440587.5) * 86400.0)"
        return self.as_sql(compiler, connection, template=template, **extra_context)


def id_in(column: str, ids: list[int]):
    """A filter: ``column`` (table.column) is one of ``ids``, as one array parameter on PostgreSQL (a list of
    thousands of ids as as many parameters costs milliseconds to build and parse; typed, or the
    planner may not use the index: a list of small ids arrives as ``smallint[]``); ``IN`` elsewhere."""
    if connection.vendor != "postgresql":
        marks = ", ".join(["%s"] * len(ids)) or "NULL"
        return RawSQL(f"{column} IN ({marks})", tuple(ids), output_field=BooleanField())
    return RawSQL(f"{column} = ANY(%s::bigint[])", (int_array(ids),), output_field=BooleanField())


# What the tick reads of each workload holding resources: the columns the policy, the service accrual
# and the start estimates use.
HOLDING_FIELDS = (
    "pk",
    "owner_id",
    "team",
    "kind",
    "status",
    "gpu_model",
    "gpu_count",
    "gpu_milli",
    "cpu_cores",
    "memory_mb",
    "pinned_node_id",
    "nodes",
    "node_id",
    "no_gpu",
    "priority",
    "preemptible",
    "spot",
    "group_id",
    "preemptions",
    "queue_level",
    "attained_service",
    "gpu_utilization",
    "max_runtime_s",
    "elastic_min",
    "elastic_max",
    "master_port",
)
HOLDING_TIMES = {
    "created_s": "created_at",
    "queued_s": "queued_at",
    "started_s": "started_at",
    "accrued_s": "accrued_at",
    "resized_s": "resized_at",
}


def holding_rows(*, ids: list[int] | None = None, version: str | None = None) -> list:
    """Work holding resources (starting, running, stopping) as named rows of ``HOLDING_FIELDS`` and its
    times as seconds since 1970 (``created_s``, ``queued_s``, ``started_s``, ``accrued_s``, ``resized_s``; None where
    unset).
    ``ids``: only these (None: all); ``version``: an SQL expression of the row's version, read as ``version``
    (``scheduler.holding``).

    Rows, not model objects: every tick reads every one (5,000 on 1,000 nodes), and building the models
    (with their JSON fields parsed) and converting them took ~0.6 s of every tick."""
    times = {name: EpochSeconds(field) for name, field in HOLDING_TIMES.items()}
    if version is not None:
        times["version"] = RawSQL(version, ())
    rows = Workload.objects.filter(status__in=WorkloadStatus.holding_resources())
    if ids is not None:
        rows = rows.filter(id_in("scheduler_workload.id", ids))
    return list(rows.annotate(**times).order_by("pk").values_list(*HOLDING_FIELDS, *times, named=True))


HISTORY_PER_OWNER = 100  # a queued job's prediction reads at most this many of its owner's past jobs


def job_history(owner_ids) -> DurationHistory:
    """The past jobs of these owners that ended by themselves (an exit code: succeeded or failed, released or
    not; a cancelled one says nothing of how long its kind runs), the newest ``HISTORY_PER_OWNER`` × owners of them
    (one busy owner may take more than their share), each as its service per card (weighted GPU-seconds over its
    cards: the MLFQ's own measure)."""
    history = DurationHistory()
    owner_ids = set(owner_ids)
    rows = (
        Workload.objects.filter(kind=WorkloadKind.JOB, owner_id__in=owner_ids, exit_code__isnull=False)
        .exclude(finished_at=None)
        .order_by("-finished_at")
        .values_list("owner_id", "image_ref", "gpu_count", "gpu_milli", "attained_service")
    )
    for owner, image, count, milli, service in reversed(rows[: HISTORY_PER_OWNER * len(owner_ids)]):
        cards = count * milli / WHOLE_CARD
        if cards:
            history.record(owner, image, cards, service / cards)
    return history


def node_list():
    """Every node with its cards (prefetched, in index order), for admins' views."""
    return Node.objects.prefetch_related(Prefetch("gpus", Gpu.objects.order_by("index")))


def gpu_models_summary() -> dict[str, dict]:
    """Per GPU model on active nodes: cards, free whole cards, free share, most cards on one node, and per
    node (name, free cards, free share, its CPU cores and memory) — what the GPU market shows."""
    summary: dict[str, dict] = {}
    per_node: Counter = Counter()
    cards = Gpu.objects.filter(node__status=NodeStatus.ACTIVE).values(
        "model", "node_id", "allocated_milli", "node__simulated", "node__name", "node__cpu_cores", "node__memory_mb"
    )
    for g in cards.order_by("node__name", "index"):
        row = summary.setdefault(
            g["model"],
            {"cards": 0, "free_cards": 0, "free_share": 0.0, "simulated": False, "max_cards_per_node": 0, "nodes": {}},
        )
        free = (WHOLE_CARD - g["allocated_milli"]) / WHOLE_CARD
        row["cards"] += 1
        row["free_cards"] += g["allocated_milli"] == 0
        row["free_share"] = round(row["free_share"] + free, 3)
        row["simulated"] |= g["node__simulated"]
        per_node[g["model"], g["node_id"]] += 1
        row["max_cards_per_node"] = max(row["max_cards_per_node"], per_node[g["model"], g["node_id"]])
        node = row["nodes"].setdefault(
            g["node__name"],
            {
                "free_cards": 0,
                "free_share": 0.0,
                "cpu_cores": g["node__cpu_cores"],
                "memory_gb": g["node__memory_mb"] // 1024,
            },
        )
        node["free_cards"] += g["allocated_milli"] == 0
        node["free_share"] = round(node["free_share"] + free, 3)
    return summary


def fit_problem(
    *,
    gpu_model: str,
    gpu_count: int,
    cpu_cores: int,
    memory_mb: int,
    disk_gb: int = 0,
    nodes: int | None = None,
    gang: bool = False,
) -> tuple[str, str] | None:
    """Why a request could never run on the registered active nodes, as (field, message); None if it could.

    ``gang``: it may span nodes (whole cards; CPU and memory are per node): exactly ``nodes`` of them with
    gpu_count / nodes cards each, or — ``nodes`` None — as many as it takes when no node has them all."""
    found = Node.objects.filter(status=NodeStatus.ACTIVE, gpus__model=gpu_model).annotate(cards=Count("gpus"))
    if not found:
        return "gpu_model", f"no node in the cluster has {gpu_model} cards"
    if gang and ((nodes or 1) > 1 or not any(n.cards >= gpu_count for n in found)):
        return _gang_problem(list(found), gpu_model, gpu_count, cpu_cores, memory_mb, nodes)
    with_cards = [n for n in found if n.cards >= gpu_count]
    if not with_cards:
        most = max(n.cards for n in found)
        return "gpu_count", f"no node has {gpu_count} {gpu_model} cards (at most {most} on one node)"
    if not any(n.cpu_cores >= cpu_cores for n in with_cards):
        most = max(n.cpu_cores for n in with_cards)
        return "cpu_cores", f"no {gpu_model} node has {cpu_cores} CPU cores (at most {most})"
    if not any(n.cpu_cores >= cpu_cores and n.memory_mb >= memory_mb for n in with_cards):
        most = max(n.memory_mb for n in with_cards) // 1024
        return "memory_mb", f"no {gpu_model} node has that much memory (at most {most} GB)"
    need = disk_reserved_gb(disk_gb)
    if disk_gb and not any(n.disk_gb is None or n.disk_gb >= need for n in with_cards):
        most = max(n.disk_gb for n in with_cards) - settings.INSTANCE_SYSTEM_DISK_GB
        return "disk_gb", f"no {gpu_model} node has room for a {disk_gb} GB data disk (at most {max(most, 0)} GB)"
    return None


def workload_utilizations(*, since=None, min_minutes: int = 10) -> list[float]:
    """Each workload's average GPU utilization of its share over its measured minutes (the minute rollups),
    for workloads measured at least ``min_minutes``: the distribution the simulator can replay
    (``scheduler.sim.utilization.measured``)."""
    rows = WorkloadGpuMinute.objects.filter(util_avg__isnull=False)
    if since is not None:
        rows = rows.filter(minute__gte=since)
    per_workload = rows.values("workload").annotate(u=Avg("util_avg"), n=Count("minute", distinct=True))
    return [row["u"] for row in per_workload.filter(n__gte=min_minutes).order_by("workload")]


def _gang_problem(found, gpu_model, gpu_count, cpu_cores, memory_mb, nodes) -> tuple[str, str] | None:
    if nodes and gpu_count % nodes:
        return "nodes", f"{gpu_count} cards do not split evenly over {nodes} nodes"
    roomy = [n for n in found if n.cpu_cores >= cpu_cores and n.memory_mb >= memory_mb]
    if not roomy:
        return "cpu_cores", f"no {gpu_model} node has {cpu_cores} CPU cores and that much memory (asked per node)"
    if nodes:
        each = gpu_count // nodes
        enough = [n for n in roomy if n.cards >= each]
        if len(enough) < nodes:
            return "nodes", (
                f"{nodes} nodes with {each} {gpu_model} cards each are asked for; the cluster has "
                f"{len(enough)} such nodes (with the CPU and memory asked per node)"
            )
        return None
    total = sum(n.cards for n in roomy)
    if total < gpu_count:
        return "gpu_count", (
            f"{gpu_count} {gpu_model} cards are asked for; the cluster has {total} on nodes with the CPU and "
            "memory asked per node"
        )
    return None
