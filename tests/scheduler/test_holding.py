"""The tick's holding rows and capacity kept across ticks (``scheduler.holding``): a read after changes equals a
whole read, and re-reads only the rows that changed.

Each test runs inside one transaction, the case the row version's ``ctid`` is there for: every row the test
writes has the same ``xmin``."""

import random

import pytest

from scheduler import holding
from scheduler.holding import WHOLE_READ_S, CapacityCache, HoldingCache
from scheduler.models import Allocation, Node, NodeStatus, Workload, WorkloadStatus
from scheduler.selectors import cluster_capacity, holding_rows
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
