"""The tick's holding rows kept across ticks (``scheduler.holding``): a read after changes equals a whole read, and
re-reads only the rows that changed.

Each test runs inside one transaction, the case the row version's ``ctid`` is there for: every row the test
writes has the same ``xmin``."""

import random

import pytest

from scheduler.holding import FULL_READ_EVERY, HoldingCache
from scheduler.models import Allocation, Workload, WorkloadStatus
from scheduler.selectors import holding_rows
from scheduler.services.allocation import Placement, Share, allocations_create
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
    [placed] = allocations_create([Placement(w, node.pk, [Share(card.pk, w.gpu_milli, 0)])])
    assert placed


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


def test_every_hundredth_read_is_whole(user):
    cache = HoldingCache()
    workload(user, status=S.RUNNING)
    for _ in range(FULL_READ_EVERY):
        cache.read()
    assert cache.last_changed == 0
    cache.read()
    assert cache.last_changed == 1
