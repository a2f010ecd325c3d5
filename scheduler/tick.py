"""The live scheduling tick: database rows -> policy objects -> ``decide`` -> rows.

Only one tick decides at a time (a PostgreSQL advisory lock, held by the
session, not a transaction). Service accrual, allocations (in batches),
preemptions, elastic resizes (``services.elastic``) and the waiting reasons are
each written in short transactions; launches and stops go to node queues after
their commit. A tick decides while work waits or while elastic work could grow.
Two steps run beside the rest on a second connection (``scheduler.beside``):
the read of the holding rows, and the accrual's write.
"""

import contextlib
import functools
import logging
import operator
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core.clients import redis_client
from core.memory import collector_paused
from scheduler import policy
from scheduler.beside import beside
from scheduler.holding import ACCRUAL_RETURNING, CAPACITY, HOLDING
from scheduler.models import Quota, Workload, WorkloadEvent, WorkloadKind, WorkloadStatus, card_share
from scheduler.selectors import disk_reserved_gb, job_history
from scheduler.services.accrual import service_accrue, service_record
from scheduler.services.allocation import Part, Placement, Share, allocations_create
from scheduler.services.elastic import workload_resize
from scheduler.services.workloads import launches_send, workload_preempt

log = logging.getLogger(__name__)
S = WorkloadStatus
TICK_LOCK_KEY = 0x67707563  # "gpuc": one advisory lock id for the whole cluster
MIX_WINDOW = 500  # recent submissions that define the expected task mix for FGD
MIX_REFRESH_S = 60.0
# Placements committed together: few statements per placement, yet rows are locked only briefly.
PLACEMENTS_PER_TRANSACTION = 200
MAX_RERUNS = 10  # a tick re-runs for wake-ups that came while it ran, at most this often in a row


def mlfq_config() -> policy.MlfqConfig:
    return policy.MlfqConfig(
        thresholds=tuple(settings.SCHEDULER_THRESHOLDS_GPU_S),
        idle_util=settings.SCHEDULER_IDLE_UTIL,
        idle_weight=settings.SCHEDULER_IDLE_WEIGHT,
        starvation_s=settings.SCHEDULER_STARVATION_S,
        preemption=settings.SCHEDULER_PREEMPTION,
        reserve_after_s=settings.SCHEDULER_RESERVE_AFTER_S,
        reservations=settings.SCHEDULER_RESERVATIONS,
        resize_interval_s=settings.SCHEDULER_RESIZE_INTERVAL_S,
        predict=settings.SCHEDULER_PREDICT,
    )


@dataclass
class TickResult:
    placed: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    resized: list[int] = field(default_factory=list)
    waiting: int = 0


@contextlib.contextmanager
def tick_lock():
    """Yield True when this tick may decide: one at a time across the cluster.

    PostgreSQL: a session-level advisory lock, held for the tick but by no
    transaction, so row locks stay short (heartbeats and agent transitions never
    wait for a whole tick); released if the worker dies. SQLite (development,
    one machine): BEGIN IMMEDIATE serialises the tick's writes instead.
    """
    if connection.vendor != "postgresql":
        with transaction.atomic():
            yield True
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [TICK_LOCK_KEY])
        held = cursor.fetchone()[0]
    try:
        yield held
    finally:
        if held:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [TICK_LOCK_KEY])


def _wakeup_key() -> str:
    return f"gpucloud:{settings.DEPLOYMENT_ID}:tick-wanted"


def schedule_tick() -> TickResult:
    """Run a tick; a wake-up that finds another tick running is not lost but makes it run again.

    A tick that loses the lock raises a flag, then tries once more; the holder
    checks the flag after it lets go. Either the holder sees the flag or the
    late one gets the lock, so every wake-up is followed by a whole tick.
    """
    result = TickResult()
    for attempt in range(MAX_RERUNS + 1):
        with tick_lock() as held:
            if held:
                with collector_paused(freeze=True):
                    result = _tick()
        if not held:
            redis_client().set(_wakeup_key(), 1)
            with tick_lock() as held:
                if not held:
                    return result  # the holder will see the flag once it lets go
                with collector_paused(freeze=True):
                    result = _tick()
        if not redis_client().getdel(_wakeup_key()):
            return result
        log.info("a wake-up came during the tick: ticking again (%d)", attempt + 1)
    return result


def _request(w, *, disk_gb: int = 0) -> policy.Request:
    """What the work takes where it is placed; ``disk_gb``: the disk it reserves on each of its nodes (queued
    work's; holding work's disks are counted as held, ``selectors.disk_held``)."""
    return policy.Request(
        w.pk,
        w.gpu_model,
        w.gpu_count,
        w.gpu_milli,
        w.cpu_cores,
        w.memory_mb,
        w.pinned_node_id,
        disk_gb=disk_gb,
        nodes=w.nodes,
    )


def _queued_work(w: Workload, epoch: float) -> policy.Work:
    """Queued work as the policy sees it; times in seconds since ``epoch`` (seconds since 1970).

    Its ``remaining`` is its maximum runtime, where it has one: work known to end before a reservation
    starts may backfill on the reserved nodes, as in the simulator (where the trace knows it exactly)."""
    group = w.group
    return policy.Work(
        id=w.pk,
        user=str(w.owner_id),
        team=w.team,
        # Work that returns to its node finds its disks there (counted there already); other work reserves its own.
        request=_request(w, disk_gb=0 if w.pinned_node_id else disk_reserved_gb(w.disk_gb)),
        submitted=w.created_at.timestamp() - epoch,
        waiting_since=(w.queued_at or w.created_at).timestamp() - epoch,
        priority=w.priority,
        attained=w.attained_service,
        preemptible=w.preemptible,
        spot=w.spot,
        group=w.group_id,
        group_cap=group.max_running if group else None,
        preemptions=w.preemptions,
        fallback_after=group.spot_fallback_after if group else None,
        fallback_at=group.spot_fallback_at.timestamp() - epoch if group and group.spot_fallback_at else None,
        level=w.queue_level,
        started=(w.started_at or w.created_at).timestamp() - epoch,
        remaining=float(w.max_runtime_s) if w.max_runtime_s else None,
        elastic_min=w.elastic_min,
        elastic_max=w.elastic_max,
    )


def _predict(waiting: list[policy.Work], by_id: dict) -> None:
    """Each queued job's duration (service per card) as its owner's past jobs of its image and cards predict."""
    jobs = [w for w in waiting if by_id[w.id].kind == WorkloadKind.JOB]
    history = job_history({by_id[w.id].owner_id for w in jobs})
    for work in jobs:
        row = by_id[work.id]
        work.predicted = history.predict(row.owner_id, row.image_ref, work.request.gpus)


@dataclass(eq=False)
class _Kept:
    """What a holding row gives the policy that stays the same while its row object does (``scheduler.holding``
    keeps the objects of unchanged rows), or changes only in what the accrual writes (its level is taken), and the
    epoch stays too: its ``Work`` (``work``, handed to the policy itself, its service and time left set each tick:
    what the policy changes of a running work it says in its decisions, and those works are built again:
    ``_changed_by``); and while its cards and the cluster's card layout stay the same objects, where it runs
    (``where``: node row, cards, other members, set on the work)."""

    row: object
    epoch: float
    work: policy.Work
    end: float | None  # when its maximum runtime ends, in seconds since 1970
    resized_now: bool  # elastic work not started yet: its size is as of now
    cards_held: object = None
    layout: object = None
    where: tuple | None = None


_kept: dict[int, _Kept] = {}
_accrued: dict = {}  # the accrual's kept entries (``service_accrue``'s ``kept``)
_epoch: list[float] = [float("inf")]  # the last tick's epoch (seconds since 1970): it moves only back


def _kept_for(w, kept: _Kept | None, epoch: float) -> _Kept:
    """The kept work of holding row ``w`` where its entry (``kept``, None for none) is not of this row object and
    epoch (``_running_works`` takes those as they are): brought to the row where only the accrual wrote it, else
    built again."""
    if kept is not None and kept.epoch == epoch and _accrued_only(kept.row, w):
        kept.row, kept.work.level = w, w.queue_level  # the accrual's own write (hundreds a tick): only the level
        return kept
    request = _request(w)
    elastic = w.elastic_min is not None
    if elastic and w.master_port is None:
        request = replace(request, pinned_node=w.node_id)
    work = policy.Work(
        id=w.pk,
        user=str(w.owner_id),
        team=w.team,
        request=request,
        submitted=w.created_s - epoch,
        waiting_since=(w.queued_s or w.created_s) - epoch,
        priority=w.priority,
        preemptible=w.preemptible,
        spot=w.spot,
        group=w.group_id,
        preemptions=w.preemptions,
        level=w.queue_level,
        stopping=w.status == S.STOPPING,
        started=(w.started_s or w.created_s) - epoch,
        elastic_min=w.elastic_min,
        elastic_max=w.elastic_max,
        # Its last resize: its run's start (a restart is a new run), or a member's joining or leaving since.
        resized_at=max(w.started_s, w.resized_s or 0) - epoch if elastic and w.started_s is not None else -float("inf"),
    )
    end = w.started_s + w.max_runtime_s if w.max_runtime_s and w.started_s is not None else None
    kept = _kept[w.pk] = _Kept(w, epoch, work, end, resized_now=elastic and w.started_s is None)
    return kept


def _holding_work(kept: _Kept, epoch: float, attained: float, now: float) -> policy.Work:
    """A holding row (``selectors.holding_rows``, as ``_kept_for`` keeps it) as the policy sees it: its array's
    limits and its fallback to on-demand matter only while work waits, and are left out. ``now``: seconds since 1970.

    Its ``remaining`` runs to the end of its maximum runtime (the latest it frees its cards: what a
    reservation's start is reckoned from). Elastic work last changed size when its run started (a restart
    is a new run) or when a member last joined or left it (``resized_at``); while it starts it may not be
    resized. Elastic work of one node keeps to that
    node (its checkpoint volume is there): it grows only there, and is requeued there after a resize."""
    work = kept.work
    work.attained = attained
    work.remaining = None if kept.end is None else max(kept.end - now, 0.0)
    if kept.resized_now:
        work.resized_at = now - epoch
    return work


def _changed_by(decisions) -> None:
    """Forget the kept works the policy changed (``_Kept``): an evicted one is marked stopping, a resized one
    has its new size and cards; they are built from their rows at the next tick, whether the change committed
    or not."""
    for pk in [p.work_id for p in decisions.preempt] + [r.work_id for r in decisions.resize]:
        _kept.pop(pk, None)


def _accrued_only(before, after) -> bool:
    """Whether two versions of a holding row differ at most in what the accrual writes (``ACCRUAL_RETURNING``)."""
    if before._fields != after._fields:
        return False
    columns = _not_accrued(before._fields)
    return columns(before) == columns(after)


@functools.cache
def _not_accrued(fields: tuple) -> operator.itemgetter:
    """The columns of a row of these fields that the accrual does not write, as one tuple (compared in C)."""
    return operator.itemgetter(*(i for i, name in enumerate(fields) if name not in ACCRUAL_RETURNING))


def _quotas() -> policy.Quotas:
    quotas = policy.Quotas(default_user=settings.USER_MAX_CARDS)
    for q in Quota.objects.all():
        if q.user_id:
            quotas.per_user[str(q.user_id)] = float(q.max_cards)
        else:
            quotas.per_team[q.team] = float(q.max_cards)
    return quotas


_kept_mix: list = [None, -float("inf")]  # the mix, and when it was read (time.monotonic)


def _mix() -> list[policy.TaskType]:
    """The expected task mix, read again once every MIX_REFRESH_S (the trace simulator keeps one for a whole
    trace). The same object while it is the same: FGD's scores cached across ticks are of one mix object."""
    mix, read_at = _kept_mix
    if mix is None or time.monotonic() - read_at >= MIX_REFRESH_S:
        recent = Workload.objects.order_by("-id").values_list("gpu_count", "gpu_milli", "cpu_cores", "memory_mb")
        fresh = policy.task_mix(recent[:MIX_WINDOW])
        _kept_mix[:] = [mix if fresh == mix else fresh, time.monotonic()]
    return _kept_mix[0]


def mix_forget() -> None:
    """Read the mix afresh at the next tick."""
    _kept_mix[:] = [None, -float("inf")]


def _estimated_starts(waiting: dict, by_id: dict, holding: list, cluster) -> dict:
    """A rough start time for each waiting work, in queue order, from when running jobs must end.

    Running jobs with a maximum runtime free their share by then at the latest;
    earlier waiters of the same GPU model claim freed share first. Where the
    share is held by work without an end (instances), the estimate is unknown.
    """
    free_now = {
        model: float(cluster.free[cluster.exists & (cluster.model == code)].sum()) / policy.WHOLE_CARD
        for model, code in cluster.models.items()
    }
    ends: dict[str, list] = {}
    for w in holding:
        if w.kind == "job" and w.max_runtime_s and w.started_s:
            end = datetime.fromtimestamp(w.started_s + w.max_runtime_s, UTC)
            ends.setdefault(w.gpu_model, []).append((end, card_share(w.gpu_count, w.gpu_milli, no_gpu=w.no_gpu)))
    claimed: dict[str, float] = {}
    estimates = {}
    for work_id, _ in sorted(waiting.items(), key=lambda item: (item[1].level, item[1].position)):
        w = by_id[work_id]
        claimed[w.gpu_model] = claimed.get(w.gpu_model, 0.0) + w.gpu_share
        available = free_now.get(w.gpu_model, 0.0)
        for end, share in sorted(ends.get(w.gpu_model, [])):
            available += share
            if available + 1e-9 >= claimed[w.gpu_model]:
                estimates[work_id] = end
                break
    return estimates


def _tick() -> TickResult:
    """Place queued work that fits, evict what must make room, and say why the rest waits.

    Call holding the tick lock. Each write is its own short transaction; the
    allocation service re-checks capacity under row locks, so a change since the
    tick's read (a stop, a heartbeat, a lost node) can only make a placement fail,
    never over-allocate.
    """
    result = TickResult()
    now = timezone.now()
    config = mlfq_config()
    reading = beside(HOLDING.read)  # on its own connection, while this one reads the queue and the capacity
    queued = list(Workload.objects.filter(status=S.QUEUED).select_related("group"))
    cluster = CAPACITY.state() if queued else None
    holding, cards_held = reading.result()
    accrued = service_accrue(
        holding, now=now, idle_util=config.idle_util, idle_weight=config.idle_weight, kept=_accrued
    )
    if not queued and not any(_may_grow(w) for w in holding):
        HOLDING.rows_written(service_record(accrued, {}, now=now, **HOLDING.write_guard()))
        return result
    # Times are seconds since the oldest work's creation, or an older epoch kept: moving it forward would rebuild
    # every kept running work (``_kept_for``) whenever the oldest work ends; only differences count to the policy.
    epoch = _epoch[0] = min([w.created_at.timestamp() for w in queued] + [w.created_s for w in holding] + _epoch)
    if cluster is None:
        cluster = CAPACITY.state()
    by_id = {w.pk: w for w in queued}
    waiting = [_queued_work(w, epoch) for w in queued]
    if config.predict:
        _predict(waiting, by_id)
    running = _running_works(
        holding, cluster, epoch, cards_held, {pk: a.attained for pk, a in accrued.items()}, now.timestamp()
    )
    try:
        decisions = policy.decide(
            waiting,
            running,
            cluster,
            now=now.timestamp() - epoch,
            discipline=policy.DISCIPLINES["mlfq"](config),
            strategy=settings.SCHEDULER_PLACEMENT,
            mix=_mix(),
            quotas=_quotas(),
        )
    except BaseException:
        _kept.clear()  # what it changed of the running works before it failed is not known
        raise
    _changed_by(decisions)
    # The accrual's write (hundreds of running rows, each only at the version read) on its own connection while this
    # one commits the placements (queued rows, their nodes and cards). A row requeued and placed since the read is
    # the only one both touch: the write waits for that placement's commit, then skips it (its version changed).
    # This thread waits for the write only once its own transactions have committed, so neither waits on the other.
    recording = beside(service_record, accrued, decisions.levels, now=now, **HOLDING.write_guard())
    _record_on_demand(decisions.on_demand, by_id)
    placements = [_placement(place, by_id[place.work_id], cluster, decisions.levels) for place in decisions.place]
    for start in range(0, len(placements), PLACEMENTS_PER_TRANSACTION):
        with transaction.atomic():
            placed = allocations_create(placements[start : start + PLACEMENTS_PER_TRANSACTION])
            launches_send([p.workload for p in placed])
        result.placed += [p.workload.pk for p in placed]
    victims = Workload.objects.in_bulk([preempt.work_id for preempt in decisions.preempt])
    for preempt in decisions.preempt:
        reason = f"making room for higher-priority work #{preempt.for_work_id}"
        if preempt.work_id in victims and workload_preempt(victims[preempt.work_id], reason=reason):
            result.preempted.append(preempt.work_id)
    resizing = Workload.objects.select_related("node").in_bulk([r.work_id for r in decisions.resize])
    for resize in decisions.resize:
        w = resizing.get(resize.work_id)
        if w is None:
            continue
        parts = [Part(cluster.node_ids[p.node], _shares(p, w, cluster)) for p in resize.parts]
        if workload_resize(w, gpu_count=resize.gpu_count, reason=resize.reason, parts=parts):
            result.resized.append(resize.work_id)
    _record_waiting(decisions, by_id, _estimated_starts(decisions.waiting, by_id, holding, cluster))
    HOLDING.rows_written(recording.result())
    result.waiting = len(decisions.waiting)
    if result.placed or result.preempted or result.resized:
        log.info(
            "tick placed %s, preempted %s, resized %s, %d waiting",
            result.placed,
            result.preempted,
            result.resized,
            result.waiting,
        )
    return result


def _may_grow(w) -> bool:
    """Whether a holding row is running elastic work below its largest size (a tick may grow it)."""
    return w.elastic_max is not None and w.status == S.RUNNING and w.gpu_count < w.elastic_max


def _record_on_demand(work_ids: list, by_id: dict) -> None:
    """Spot work the policy moved to on-demand, written before any placement of it commits (its meter
    segment takes the price from the row when it starts). Only while it is still queued and spot."""
    for work_id in work_ids:
        w = by_id[work_id]
        why = (
            f"runs on-demand from now on: preempted more often than its array allows "
            f"({w.preemptions} > {w.group.spot_fallback_after})"
            if w.group.spot_fallback_after is not None and w.preemptions > w.group.spot_fallback_after
            else "runs on-demand from now on: its array is past its deadline"
        )
        with transaction.atomic():
            if Workload.objects.filter(pk=work_id, status=S.QUEUED, spot=True).update(spot=False):
                WorkloadEvent.objects.create(workload_id=work_id, from_status=S.QUEUED, to_status=S.QUEUED, reason=why)
        w.spot = False


def _shares(part, workload: Workload, cluster) -> list[Share]:
    """One node's part of the policy's place (or resize) as shares of card rows."""
    return [
        Share(cluster.card_ids[part.node][card], workload.gpu_milli, memory)
        for card, memory in zip(part.cards, part.memory_mb, strict=True)
    ]


def _placement(place, workload: Workload, cluster, levels: dict) -> Placement:
    """The policy's place as rows: rank 0's node and shares, and a gang's other members (``place.rest``)."""
    if workload.elastic_min is not None:
        workload.gpu_count = place.gpu_count  # elastic work starts at the size the policy gave it
    rank0, *rest = place.parts
    members = tuple(Part(cluster.node_ids[part.node], _shares(part, workload, cluster)) for part in rest)
    return Placement(
        workload, cluster.node_ids[rank0.node], _shares(rank0, workload, cluster), levels[workload.pk], rest=members
    )


def _running_works(
    holding: list, cluster, epoch: float, cards_held: dict, attained: dict, now: float | None = None
) -> list[policy.Work]:
    """Work holding cards, as the policy sees it: rank 0's node and cards, and a gang's other members'.
    ``attained``: its service up to now, by id; ``now``: seconds since 1970 (default: the clock's)."""
    now = time.time() if now is None else now
    layout, where = _card_layout(cluster)
    running = []
    visited = 0
    for w in holding:
        if w.no_gpu:
            continue  # holds no card: nothing for the policy to pack around or preempt
        kept = _kept.get(w.pk)
        if kept is None or kept.row is not w or kept.epoch != epoch:
            kept = _kept_for(w, kept, epoch)
        visited += 1
        held = cards_held.get(w.pk, ())
        if kept.cards_held is not held or kept.layout is not layout:
            kept.cards_held, kept.layout, kept.where = held, layout, _where(w, held, cluster, where)
            if kept.where is not None:
                kept.work.node, kept.work.cards, kept.work.rest = kept.where
        if kept.where is None:
            continue  # its node is not active: reconciliation deals with it
        running.append(_holding_work(kept, epoch, attained[w.pk], now))
    if len(_kept) > visited:  # some kept work is no longer holding (each visited row has its entry)
        for pk in _kept.keys() - {w.pk for w in holding}:
            del _kept[pk]
    return running


_layout: list = [None, {}]  # the last tick's card layout (node ids, each node's card ids) and card id -> (row, column)


def _card_layout(cluster) -> tuple[object, dict]:
    """The cluster's card layout, the same object while it is the same, and where each card is in it."""
    layout = (tuple(cluster.node_ids), tuple(map(tuple, cluster.card_ids)))
    if layout != _layout[0]:
        where = {card: (row, column) for row, ids in enumerate(cluster.card_ids) for column, card in enumerate(ids)}
        _layout[:] = [layout, where]
    return _layout[0], _layout[1]


def _where(w, held, cluster, where: dict) -> tuple | None:
    """(node row, card columns there, [(node row, card columns)] of the other members) of a holding row, from the
    cards it holds (``held``: ids); None when its node is not active (cards of nodes not active are left out)."""
    node = cluster.node_index.get(w.node_id)
    if node is None:
        return None
    parts: dict[int, list[int]] = {node: []}
    for gpu_id in held:
        if gpu_id in where:
            row, column = where[gpu_id]
            parts.setdefault(row, []).append(column)
    cards = parts.pop(node)
    return node, cards, list(parts.items())


def _record_waiting(decisions, by_id: dict, estimates: dict) -> None:
    """Queue level, position, reason and estimated start of waiting work, where they changed.

    Conditional on the status: work that a concurrent transition moved on keeps its own reason.
    """
    changed = []
    for work_id, wait in decisions.waiting.items():
        w = by_id[work_id]
        fields = (wait.level, wait.position, wait.reason[:255], estimates.get(work_id))
        if (w.queue_level, w.queue_position, w.status_reason, w.estimated_start_at) != fields:
            w.queue_level, w.queue_position, w.status_reason, w.estimated_start_at = fields
            changed.append(w)
    Workload.objects.filter(status=S.QUEUED).bulk_update(
        changed, ["queue_level", "queue_position", "status_reason", "estimated_start_at"], batch_size=500
    )
