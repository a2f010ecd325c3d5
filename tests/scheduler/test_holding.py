"""The tick's holding rows and capacity kept across ticks (``scheduler.holding``): a read after changes equals a
whole read, and re-reads only the rows that changed.

Each test runs inside one transaction, the case the row version's ``ctid`` is there for: every row the test
writes has the same ``xmin``."""

import random
import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from scheduler import holding
from scheduler.holding import WHOLE_READ_S, CapacityCache, HoldingCache
from scheduler.models import Allocation, Gpu, Node, NodeStatus, Workload, WorkloadStatus
from scheduler.policy import ClusterState, Request, TaskType, choose, placement
from scheduler.selectors import cluster_capacity, holding_rows
from scheduler.services.accrual import ACCRUAL_WRITE_S, service_accrue, service_record
from scheduler.services.allocation import Share, allocation_create
from scheduler.services.lifecycle import workload_transition
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db
S = WorkloadStatus


def whole() -> tuple[dict, dict]:
    """What a read without anything kept sees: rows by id without their version, and the cards each holds."""
    rows = {row.pk: row for row in holding_rows()}
    cards = {pk: [] for pk in rows}
    for workload_id, gpu_id in (
        Allocation.objects.filter(workload_id__in=rows).order_by("gpu_id").values_list("workload_id", "gpu_id")
    ):
        cards[workload_id].append(gpu_id)
    return rows, cards


def assert_same(cache: HoldingCache) -> None:
    rows, cards = cache.read()
    expected_rows, expected_cards = whole()
    assert [row.pk for row in rows] == sorted(expected_rows)
    assert {row.pk: _fields(row) for row in rows} == {pk: _fields(row) for pk, row in expected_rows.items()}
    assert cards == expected_cards


def _fields(row) -> dict:
    return {name: value for name, value in row._asdict().items() if name != "version"}


def place(w: Workload, node) -> None:
    card = node.gpus.order_by("index").filter(allocated_milli=0).first()
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, w.gpu_milli, 0)])


def test_a_read_after_changes_equals_a_whole_read_and_reads_only_what_changed(user):
    node = make_node("sim:8xRTX3090", cpu_cores=64, memory_mb=1 << 20)
    works = [workload(user, name=f"w{i}") for i in range(6)]
    for w in works[:4]:
        place(w, node)
    cache = HoldingCache()
    assert_same(cache)
    assert cache.last_changed == 4

    assert_same(cache)
    assert cache.last_changed == 0  # nothing changed: no row read whole

    Workload.objects.filter(pk=works[0].pk).update(gpu_utilization=0.25)  # a reading: same transaction, new version
    workload_transition(works[1], to=S.SUCCEEDED, allowed_from=[S.STARTING], reason="exited")  # cards given back
    place(works[4], node)  # a new one, with its card
    assert_same(cache)
    assert cache.last_changed == 2  # works[0] and works[4]; works[1] left
    assert works[1].pk not in cache.cards

    Workload.objects.filter(pk=works[0].pk).update(gpu_utilization=0.5)  # the same row again, same transaction
    assert_same(cache)
    assert cache.last_changed == 1


def test_random_changes_never_leave_the_kept_rows_behind_a_whole_read(user):
    rng = random.Random(7)
    node = make_node("sim:8xRTX3090", cpu_cores=64, memory_mb=1 << 20)
    works = [workload(user, name=f"w{i}", gpu_milli=500) for i in range(10)]
    cache = HoldingCache()
    for _ in range(25):
        w = rng.choice(works)
        w.refresh_from_db()
        if w.status == S.QUEUED:
            place(w, node)
        elif rng.random() < 0.5:
            Workload.objects.filter(pk=w.pk).update(attained_service=rng.random() * 100, queue_level=rng.randrange(3))
        else:
            workload_transition(w, to=S.QUEUED, allowed_from=[S.STARTING], reason="requeued")
        assert_same(cache)


def test_a_read_is_whole_once_every_whole_read_s(user, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(holding.time, "monotonic", lambda: clock[0])
    cache = HoldingCache()
    workload(user, status=S.RUNNING)
    cache.read()
    clock[0] += WHOLE_READ_S - 1
    cache.read()
    assert cache.last_changed == 0
    clock[0] += 1
    cache.read()
    assert cache.last_changed == 1


def capacity(nodes) -> list:
    return [(n.id, n.cpu_free, n.memory_free_mb, n.disk_free_gb, n.name, n.cards) for n in nodes]


# Committed: the cards written by a transaction that has ended. Alone: a transaction open anywhere on the same
# PostgreSQL (a test beside it) holds the horizon back, and more cards are read again than changed.
@pytest.mark.alone
@pytest.mark.django_db(transaction=True)
def test_the_capacity_kept_across_reads_equals_a_whole_read_and_reads_only_the_cards_that_changed(user):
    first = make_node("sim:4xRTX3090", cpu_cores=64, memory_mb=1 << 20)
    second = make_node("sim:4xRTX3090", cpu_cores=64, memory_mb=1 << 20)
    cache = CapacityCache()
    assert capacity(cache.read()) == capacity(cluster_capacity())
    assert cache.last_changed == 8

    w = workload(user, gpu_milli=250)
    place(w, second)  # a fraction: the card's free share and its class change
    assert capacity(cache.read()) == capacity(cluster_capacity())
    assert cache.last_changed == 1
    [card] = [c for n in cache.read() if n.id == second.pk for c in n.cards if c.free_milli < 1000]
    assert card.share_class == 250

    Node.objects.filter(pk=first.pk).update(status=NodeStatus.DRAINING)  # its cards leave the capacity
    assert capacity(cache.read()) == capacity(cluster_capacity()) and [n.id for n in cache.read()] == [second.pk]
    Node.objects.filter(pk=first.pk).update(status=NodeStatus.ACTIVE)  # and come back in (node, index) order
    assert capacity(cache.read()) == capacity(cluster_capacity())
    assert [n.id for n in cache.read()] == [first.pk, second.pk]

    workload_transition(w, to=S.SUCCEEDED, allowed_from=[S.STARTING], reason="exited")
    assert capacity(cache.read()) == capacity(cluster_capacity())
    assert cache.last_changed == 1


def arrays(state: ClusterState) -> dict:
    """Everything the policy reads of a state, model codes as the models' names (codes are given in reading order)."""
    names = {code: name for name, code in state.models.items()}
    return {
        "layout": (state.node_ids, state.node_names, state.card_ids),
        "nodes": [a.tolist() for a in (state.cpu_free, state.mem_free, state.disk_free)],
        "cards": [a.tolist() for a in (state.exists, state.free, state.card_mem_total, state.card_mem_free)],
        "classes": state.card_class.tolist(),
        "models": [[names.get(code) for code in row] for row in state.model.tolist()],
    }


@pytest.mark.django_db(transaction=True)
def test_the_state_kept_across_reads_equals_one_built_from_a_whole_read(user):
    first = make_node("sim:4xRTX3090", cpu_cores=64, memory_mb=1 << 20)
    second = make_node("sim:4xRTX3090", cpu_cores=64, memory_mb=1 << 20)
    cache = CapacityCache()
    assert arrays(cache.state()) == arrays(ClusterState(cluster_capacity()))
    kept = cache.kept_state

    w = workload(user, gpu_milli=250)
    place(w, second)  # a card's free share and class, the node's CPU and memory
    state = cache.state()
    assert arrays(state) == arrays(ClusterState(cluster_capacity()))
    assert cache.kept_state is kept  # rewritten where it changed, not built again
    state.take(0, [0, 1], 1000, 1, 1)  # the policy's changes stay in its copy
    assert arrays(cache.state()) == arrays(ClusterState(cluster_capacity()))

    workload_transition(w, to=S.SUCCEEDED, allowed_from=[S.STARTING], reason="exited")
    cache.read()  # a read that took the change, which the kept state did not follow
    assert arrays(cache.state()) == arrays(ClusterState(cluster_capacity()))

    Node.objects.filter(pk=first.pk).update(status=NodeStatus.DRAINING)  # a node leaves: built again
    assert arrays(cache.state()) == arrays(ClusterState(cluster_capacity()))
    assert cache.kept_state is not kept
    Node.objects.filter(pk=first.pk).update(status=NodeStatus.ACTIVE, cpu_cores=32)
    assert arrays(cache.state()) == arrays(ClusterState(cluster_capacity()))
    Node.objects.filter(pk=second.pk).update(allocated_cpu=5)
    assert arrays(cache.state()) == arrays(ClusterState(cluster_capacity()))


@pytest.mark.django_db(transaction=True)
def test_the_scores_kept_with_the_state_are_computed_again_only_where_the_capacity_changed(user, monkeypatch):
    nodes = [make_node("sim:4xRTX3090", cpu_cores=64, memory_mb=1 << 20) for _ in range(3)]
    mix = [TaskType(1, 1000, 1, 1024, 1.0), TaskType(2, 1000, 1, 1024, 1.0)]
    request = Request(1, "RTX3090", 1, 1000, 1, 1024)
    scored = []
    rescore = placement._rescore
    monkeypatch.setattr(placement, "_rescore", lambda *args: scored.append(args[3].tolist()) or rescore(*args))
    cache = CapacityCache()
    choose(cache.state(), request, "fgd", mix=mix)
    assert scored == [[0, 1, 2]]
    for _ in range(2):
        place(workload(user), nodes[1])  # a card, the node's CPU and memory
        expected = choose(ClusterState(cluster_capacity()), request, "fgd", mix=mix)
        scored.clear()
        assert choose(cache.state(), request, "fgd", mix=mix) == expected
        assert scored == [[1]]


@pytest.mark.django_db(transaction=True)
def test_a_card_written_by_a_transaction_open_during_a_read_is_read_once_it_has_committed():
    node = make_node("sim:4xRTX3090", cpu_cores=64, memory_mb=1 << 20)
    cache = CapacityCache()
    cache.read()
    written, commit = threading.Event(), threading.Event()

    def writer():  # another connection: a transaction that stays open across two reads
        try:
            with transaction.atomic():
                Gpu.objects.filter(node=node, index=2).update(allocated_memory_mb=1000)
                written.set()
                assert commit.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=writer)
    thread.start()
    assert written.wait(10)
    Node.objects.filter(pk=node.pk).update(cpu_cores=64)  # a later transaction, committed: the ids move on
    for _ in range(2):  # the reads while it is open see the card as it was
        assert capacity(cache.read()) == capacity(cluster_capacity())
    commit.set()
    thread.join()
    [spec] = cache.read()
    assert spec.cards[2].free_memory_mb == spec.cards[1].free_memory_mb - 1000
    assert capacity([spec]) == capacity(cluster_capacity())


@pytest.mark.django_db(transaction=True)
def test_the_capacity_is_read_whole_when_a_card_is_deleted_or_the_transaction_ids_wrap(monkeypatch):
    node = make_node("sim:4xRTX3090", cpu_cores=64, memory_mb=1 << 20)
    clock = [1000.0]
    monkeypatch.setattr(holding.time, "monotonic", lambda: clock[0])  # when a read was whole
    cache = CapacityCache()
    cache.read()
    clock[0] += 1
    cache.read()
    assert cache.last_whole == 1000.0
    Gpu.objects.filter(node=node, index=3).delete()  # no row version is left to say so
    assert capacity(cache.read()) == capacity(cluster_capacity())
    assert cache.last_whole == 1001.0
    clock[0] += 1
    gone = Gpu.objects.get(node=node, index=2)
    gone.delete()  # one deleted and one added: as many cards as before
    Gpu.objects.create(node=node, index=3, uuid="GPU-new", model=gone.model, memory_mb=gone.memory_mb)
    assert capacity(cache.read()) == capacity(cluster_capacity())
    assert cache.last_whole == 1002.0
    mark = holding._mark

    def next_epoch():  # the next transaction id 2^32 further: the ids in rows have wrapped since the last read
        (horizon, cards), next_xid = mark()
        return (horizon, cards), next_xid + (1 << 32)

    monkeypatch.setattr(holding, "_mark", next_epoch)
    clock[0] += 1
    cache.read()
    assert cache.last_whole == 1003.0


def test_a_row_that_stops_holding_between_the_version_read_and_its_whole_read_is_gone(user, monkeypatch):
    node = make_node("sim:8xRTX3090", cpu_cores=64, memory_mb=1 << 20)
    w = workload(user)
    place(w, node)
    cache = HoldingCache()
    cache.read()
    Workload.objects.filter(pk=w.pk).update(gpu_utilization=0.5)  # changed: the next read reads it whole
    read = holding.holding_rows

    def leaves_first(**kwargs):  # it ends after its version was read, before its row is
        workload_transition(w, to=S.SUCCEEDED, allowed_from=[S.STARTING], reason="exited")
        return read(**kwargs)

    monkeypatch.setattr(holding, "holding_rows", leaves_first)
    rows, cards = cache.read()
    assert rows == [] and cards == {}


def test_the_accruals_own_write_keeps_the_rows_kept_and_skips_a_row_written_since_the_read(user):
    node = make_node("sim:8xRTX3090", cpu_cores=64, memory_mb=1 << 20)
    works = [workload(user, name=f"w{i}") for i in range(3)]
    for w in works:
        place(w, node)
    started = timezone.now() - timedelta(seconds=2 * ACCRUAL_WRITE_S)  # every row's service is due a write
    Workload.objects.filter(pk__in=[w.pk for w in works]).update(status=S.RUNNING, started_at=started)
    cache = HoldingCache()
    rows, _ = cache.read()
    now = timezone.now()
    accrued = service_accrue(rows, now=now, idle_util=0.1, idle_weight=0.5)
    Workload.objects.filter(pk=works[2].pk).update(gpu_utilization=0.75)  # a reading after the tick's read
    written = service_record(accrued, {works[1].pk: 1}, now=now, **cache.write_guard())
    assert sorted(pk for pk, *_ in written) == [works[0].pk, works[1].pk]  # not the row written since
    assert Workload.objects.get(pk=works[2].pk).accrued_at is None  # its service waits for the next tick
    cache.rows_written(written)

    assert_same(cache)
    assert cache.last_changed == 1  # only the row the reading wrote: the accrual's own rows stayed kept
    assert Workload.objects.get(pk=works[1].pk).queue_level == 1
