"""Taking shares of cards for workloads, under row locks, many placements per transaction.

A gang (work placed on several nodes) is one placement of several parts, rank 0's first:
all its parts are taken under the same locks, or none is; its member rows (one per node)
and its rendezvous port on rank 0's host are written with its allocations.

Lock order, everywhere: the workload rows (by id), then the node rows (by id),
then their card rows (by id); freeing (lifecycle.allocations_free) follows the
same order. The free capacity is re-checked under those locks, placement by
placement (the disk its tenants' disks reserve too: ``selectors.disk_held``), so a
stale plan (from the policy, or a racing worker) can only place less, never
over-allocate; the database's check constraints are the last line behind that.

One share size per card (``scheduler.policy.cluster``): a card's MPS daemon sets one
limit for all its clients, so a fraction joins only a card holding no fraction or
fractions of its own size. That too is re-checked under the card locks, from the
allocation rows (every writer of a card's allocations holds its lock), so two workers
racing for an empty card cannot put a 0.25 and a 0.5 on it.
"""

from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models.functions import Now
from django.utils import timezone

from scheduler import sharedfs
from scheduler.models import Allocation, Gpu, MemberStatus, Node, NodeStatus, Workload, WorkloadMember, WorkloadStatus
from scheduler.policy.cluster import WHOLE_CARD
from scheduler.selectors import disk_held, disk_reserved_gb, id_in
from scheduler.services.bulk import rows_insert, rows_update
from scheduler.services.lifecycle import transitions_recorded

S = WorkloadStatus
# What placing reads and writes of a locked node (``_rows_locked``), and what the work placed there is sent with.
NODE_FIELDS = ("name", "status", "cpu_cores", "allocated_cpu", "memory_mb", "allocated_memory_mb", "disk_gb")
CARD_FIELDS = ("node_id", "model", "memory_mb", "allocated_milli", "allocated_memory_mb")  # and of a locked card


@dataclass(frozen=True)
class Share:
    gpu_id: int
    milli: int
    memory_mb: int


@dataclass(frozen=True)
class Part:
    """What one node holds of a placement: its shares (and the work's CPU and memory per member)."""

    node_id: int
    shares: list[Share]


@dataclass(frozen=True)
class Placement:
    workload: Workload
    node_id: int  # rank 0's node
    shares: list[Share]  # rank 0's shares
    queue_level: int | None = None  # the level the tick decided at, recorded with the placement
    rest: tuple[Part, ...] = ()  # a gang's other members, rank 1 first

    @property
    def parts(self) -> list[Part]:
        return [Part(self.node_id, self.shares), *self.rest]

    @property
    def gang(self) -> bool:
        """Placed as a gang: on several nodes; or elastic work where checkpoints are shared (a gang of one
        member, so that members can join it while it runs: ``services.elastic``)."""
        return bool(self.rest) or (self.workload.elastic_min is not None and sharedfs.enabled())


def allocation_create(*, workload: Workload, node_id: int, shares: list[Share]) -> bool:
    """Take ``shares`` on node ``node_id`` for ``workload`` and move it from queued to starting.

    Returns False, writing nothing, when the capacity is no longer there or the
    workload is no longer queued.
    """
    placed = allocations_create([Placement(workload, node_id, shares)])
    if placed:
        workload.refresh_from_db()
    return bool(placed)


def allocations_create(placements: list[Placement]) -> list[Placement]:
    """Commit, in one transaction, every placement that still fits; returns those placed (now starting).

    A placement is skipped when its workload is no longer queued, its node is no
    longer active, or its node or cards no longer have the room (counting the
    placements before it in the list).
    """
    if not placements:
        return []
    try:
        with transaction.atomic():
            queued = dict(
                Workload.objects.select_for_update()
                .filter(id_in("scheduler_workload.id", [p.workload.pk for p in placements]), status=S.QUEUED)
                .order_by("pk")
                .values_list("pk", "master_port")
            )
            # Work whose last placement was a gang (``Workload.is_gang``, as locked): the only work with members.
            had_members = {pk for pk, port in queued.items() if port is not None}
            nodes, cards = _rows_locked([part for p in placements for part in p.parts])
            ports = _ports_in_use([p.node_id for p in placements if p.gang])
            placed = [p for p in placements if p.workload.pk in queued and _take(p, nodes, cards, ports)]
            if placed:
                _write(placed, nodes, cards, had_members)
    except IntegrityError:
        # A check constraint caught what the re-check above should have: treat as no fit.
        return []
    return placed


def _rows_locked(parts: list[Part]) -> tuple[dict, dict]:
    """The parts' active nodes and their cards by id, locked in the lock order (nodes, then cards, each by id),
    with the share sizes each card serves and each node's disk room. A node and a card as what placing reads and
    writes of them (``NODE_FIELDS``, ``CARD_FIELDS``): a node's timestamps and addresses are a third of reading its
    row, and no one needs them, nor a card's UUID and index, here."""
    node_ids = sorted({part.node_id for part in parts})
    nodes = {
        n.pk: n
        for n in Node.objects.select_for_update()
        .filter(id_in("scheduler_node.id", node_ids), status=NodeStatus.ACTIVE)
        .only(*NODE_FIELDS)
        .order_by("pk")
    }
    cards = {
        c.pk: c
        for c in Gpu.objects.select_for_update()
        .filter(id_in("scheduler_gpu.id", sorted({s.gpu_id for part in parts for s in part.shares})))
        .only(*CARD_FIELDS)
        .order_by("id")
    }
    _share_sizes_held(cards)
    _disk_room(nodes)
    return nodes, cards


def _taken_write(taken: list[tuple[int, list[Part]]], nodes: dict, cards: dict) -> None:
    """What was taken in memory ((workload id, its parts) each), written: the cards' and the nodes' counters,
    and an allocation row per share."""
    touched_cards = {s.gpu_id for _, parts in taken for part in parts for s in part.shares}
    rows_update(Gpu, [cards[i] for i in touched_cards], ["allocated_milli", "allocated_memory_mb"])
    touched_nodes = {part.node_id for _, parts in taken for part in parts}
    rows_update(Node, [nodes[i] for i in touched_nodes], ["allocated_cpu", "allocated_memory_mb"])
    rows_insert(
        Allocation,
        ["workload_id", "gpu_id", "milli", "memory_mb"],
        [(pk, s.gpu_id, s.milli, s.memory_mb) for pk, parts in taken for part in parts for s in part.shares],
    )


def _share_sizes_held(cards: dict) -> None:
    """Set ``fractions`` on each card: the sizes of the fractions of it allocated now (call holding the
    card locks, after they are taken)."""
    for card in cards.values():
        card.fractions = set()
    held = Allocation.objects.filter(id_in("scheduler_allocation.gpu_id", list(cards)), milli__lt=WHOLE_CARD)
    held = held.values_list("gpu_id", "milli")
    for gpu_id, milli in held.distinct():
        cards[gpu_id].fractions.add(milli)


def _disk_room(nodes: dict) -> None:
    """Set ``disk_room`` on each node: GB its tenants' disks may still reserve, None where disk is not counted
    (call holding the node locks: every placement, move and disk growth on a node holds its lock)."""
    counted = {pk for pk, node in nodes.items() if node.disk_gb is not None}
    held = disk_held(list(counted))
    for pk, node in nodes.items():
        node.disk_room = node.disk_gb - held.get(pk, 0) if pk in counted else None


def _disk_taken(workload: Workload, node) -> int:
    """GB the workload reserves on ``node`` by being placed there: none on the node it must return to (counted there
    already while it waits: ``selectors.disk_held``)."""
    return 0 if workload.pinned_node_id == node.pk else disk_reserved_gb(workload.disk_gb)


def _ports_in_use(node_ids: list[int]) -> dict[int, set[int]]:
    """Rendezvous ports taken on these nodes by the gangs whose rank 0 they hold (call holding the node locks)."""
    taken: dict[int, set[int]] = {node_id: set() for node_id in node_ids}
    holding = Workload.objects.filter(node_id__in=node_ids, status__in=S.holding_resources(), master_port__isnull=False)
    for node_id, port in holding.values_list("node_id", "master_port"):
        taken[node_id].add(port)
    return taken


def _take(placement: Placement, nodes: dict, cards: dict, ports: dict) -> bool:
    """Subtract every part of the placement from the locked rows in memory if all fit; False (nothing
    taken) if any does not. A gang's rank 0 also takes a free rendezvous port on its node."""
    workload = placement.workload
    parts = placement.parts
    if len({part.node_id for part in parts}) != len(parts):
        return False  # one member per node
    if len(parts) > 1 and (workload.no_gpu or workload.gpu_milli != WHOLE_CARD or not all(p.shares for p in parts)):
        return False  # a gang takes whole cards on every member's node
    if workload.nodes and len(parts) != workload.nodes:
        return False
    shares = [s for part in parts for s in part.shares]
    cards_asked = 0 if workload.no_gpu else workload.gpu_count
    if len({s.gpu_id for s in shares}) != cards_asked or len(shares) != cards_asked:
        return False
    if any(s.milli != workload.gpu_milli for s in shares):
        return False  # exactly the share asked for (and billed), on as many distinct cards as asked
    if not all(_part_fits(workload, part, nodes, cards) for part in parts):
        return False
    port = None
    if placement.gang:
        taken = ports[placement.node_id]
        port = next((p for p in range(settings.GANG_PORT_MIN, settings.GANG_PORT_MAX + 1) if p not in taken), None)
        if port is None:
            return False  # every rendezvous port of rank 0's host is taken
        taken.add(port)
    workload.master_port = port
    for part in parts:
        _part_take(workload, part, nodes, cards)
    return True


def _part_fits(workload: Workload, part: Part, nodes: dict, cards: dict) -> bool:
    """Whether the locked rows (less what was taken before) still hold one node's part of the work."""
    node = nodes.get(part.node_id)
    if node is None:
        return False
    if node.cpu_cores - node.allocated_cpu < workload.held_cpu_cores:
        return False
    if node.memory_mb - node.allocated_memory_mb < workload.held_memory_mb:
        return False
    if node.disk_room is not None and node.disk_room < _disk_taken(workload, node):
        return False
    for share in part.shares:
        card = cards.get(share.gpu_id)
        if card is None or card.node_id != node.pk or card.model != workload.gpu_model:
            return False
        if card.allocated_milli + share.milli > WHOLE_CARD:
            return False
        if share.milli < WHOLE_CARD and card.fractions - {share.milli}:
            return False  # the card serves fractions of another size
        if card.allocated_memory_mb + share.memory_mb > card.memory_mb:
            return False
    return True


def _part_take(workload: Workload, part: Part, nodes: dict, cards: dict) -> None:
    """Subtract one node's part from the locked rows in memory (it fits: ``_part_fits``)."""
    for share in part.shares:
        cards[share.gpu_id].allocated_milli += share.milli
        cards[share.gpu_id].allocated_memory_mb += share.memory_mb
        if share.milli < WHOLE_CARD:
            cards[share.gpu_id].fractions.add(share.milli)
    node = nodes[part.node_id]
    node.allocated_cpu += workload.held_cpu_cores
    node.allocated_memory_mb += workload.held_memory_mb
    if node.disk_room is not None:
        node.disk_room -= _disk_taken(workload, node)


def members_join(workload: Workload, parts: list[Part]) -> list[WorkloadMember]:
    """Members of a running elastic gang on more nodes (``services.elastic``): each part's cards taken under the
    same locks and re-checks as a placement's, a member row each (starting, ranks after the last), and the
    work's size; all or nothing (returns [] when any part no longer fits). Call inside a transaction holding
    the workload's row lock (the lock order: the workload, its nodes, their cards)."""
    if not parts or workload.gpu_milli != WHOLE_CARD or not all(p.shares for p in parts):
        return []
    held = set(
        WorkloadMember.objects.filter(workload=workload, status__in=MemberStatus.live()).values_list(
            "node_id", flat=True
        )
    )
    if len({p.node_id for p in parts} | held) != len(parts) + len(held):
        return []  # one member per node
    nodes, cards = _rows_locked(parts)
    for part in parts:
        if not _part_fits(workload, part, nodes, cards):
            return []
        _part_take(workload, part, nodes, cards)
    _taken_write([(workload.pk, parts)], nodes, cards)
    # A member that ended on one of these nodes (left, or exited) gives its row to the one that joins there.
    WorkloadMember.objects.filter(workload=workload, node_id__in=list(nodes)).delete()
    last = WorkloadMember.objects.filter(workload=workload).order_by("-rank").values_list("rank", flat=True).first()
    joined = WorkloadMember.objects.bulk_create(
        WorkloadMember(workload_id=workload.pk, rank=last + 1 + i, node_id=p.node_id, node_name=nodes[p.node_id].name)
        for i, p in enumerate(parts)
    )
    workload.gpu_count += sum(len(p.shares) for p in parts)
    Workload.objects.filter(pk=workload.pk).update(gpu_count=workload.gpu_count)
    return joined


def _write(placed: list[Placement], nodes: dict, cards: dict, had_members: set[int]) -> None:
    _taken_write([(p.workload.pk, p.parts) for p in placed], nodes, cards)
    _members_write(placed, nodes, had_members)
    now = timezone.now()
    workloads = []
    for p in placed:
        w = p.workload
        where = ", ".join(nodes[part.node_id].name for part in p.parts)
        w.status, w.status_reason, w.status_changed_at = S.STARTING, f"placed on {where}", now
        w.node, w.started_at, w.finished_at, w.queue_position, w.accrued_at = nodes[p.node_id], None, None, None, None
        if p.queue_level is not None:
            w.queue_level = p.queue_level
        workloads.append(w)
    # accrued_at cleared: this run's service counts from its start (scheduler.services.accrual), not from
    # the last accrual of an earlier run.
    rows_update(
        Workload,
        workloads,
        ["status_reason", "node", "queue_level", "master_port", "gpu_count"],  # elastic work's size as placed
        status=S.STARTING,
        status_changed_at=Now(),
        started_at=None,
        finished_at=None,
        queue_position=None,
        accrued_at=None,
    )
    transitions_recorded(workloads, from_status=S.QUEUED)


def _members_write(placed: list[Placement], nodes: dict, had_members: set[int]) -> None:
    """A gang's members, rank by rank, replacing those of its last placement. Only work last placed as a gang has
    any (``had_members``: a port is written with every gang's members and none without): a batch of single-node
    work deletes nothing."""
    replaced = [p.workload.pk for p in placed if p.workload.pk in had_members]
    if replaced:
        WorkloadMember.objects.filter(workload_id__in=replaced).delete()
    WorkloadMember.objects.bulk_create(
        WorkloadMember(workload_id=p.workload.pk, rank=rank, node_id=part.node_id, node_name=nodes[part.node_id].name)
        for p in placed
        if p.gang
        for rank, part in enumerate(p.parts)
    )
