"""The live tick: one at a time, short row locks, and no wake-up lost while another tick runs."""

import contextlib
import gc
import threading
import weakref
from unittest.mock import ANY

import pytest
from django.db import connection

from core.memory import collector_paused
from scheduler import tick
from scheduler.models import Workload, WorkloadStatus
from scheduler.services.allocation import Share, allocation_create
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def postgresql():
    if connection.vendor != "postgresql":
        pytest.fail("run on PostgreSQL (make test does): the tick's lock is a PostgreSQL advisory lock")


@contextlib.contextmanager
def tick_paused_in_policy(monkeypatch):
    """A tick in another thread, held inside the policy (lock taken, rows read) for the block's length."""
    inside, resume = threading.Event(), threading.Event()
    decide = tick.policy.decide

    def paused_decide(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread() and not inside.is_set():
            inside.set()
            assert resume.wait(20), "the test never resumed the paused tick"
        return decide(*args, **kwargs)

    monkeypatch.setattr(tick.policy, "decide", paused_decide)

    def run():
        try:
            tick.schedule_tick()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert inside.wait(20), "the tick never reached the policy"
        yield
    finally:
        resume.set()
        thread.join(30)
    assert not thread.is_alive()


def test_a_wake_up_that_finds_a_tick_running_makes_it_run_again(user, monkeypatch):
    make_node("sim:2xRTX3090", cpu_cores=8)
    workload(user, name="first")
    with tick_paused_in_policy(monkeypatch):
        late = workload(user, name="late")  # submitted while the tick runs: its wake-up finds the lock taken
        assert tick.schedule_tick().placed == []

    late.refresh_from_db()
    assert late.status == WorkloadStatus.STARTING, late.status_reason


def test_a_running_tick_holds_no_lock_on_running_work(user, monkeypatch):
    node = make_node("sim:2xRTX3090", cpu_cores=8)
    card = node.gpus.first()
    running = workload(user)
    assert allocation_create(workload=running, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    Workload.objects.filter(pk=running.pk).update(status=WorkloadStatus.RUNNING)
    workload(user, name="queued")

    with tick_paused_in_policy(monkeypatch):
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")  # a heartbeat or agent transition must not wait for the tick
        assert Workload.objects.filter(pk=running.pk).update(gpu_utilization=0.5) == 1
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")


def queued_messages(queue: str) -> list[tuple[str, object]]:
    """(task name, decoded body) of each message waiting on a Redis queue, oldest first, taken off it."""
    import base64
    import json

    import redis
    from django.conf import settings
    from kombu.serialization import loads

    client = redis.Redis.from_url(settings.REDIS_URL)
    raw = client.lrange(queue, 0, -1)
    client.delete(queue)
    messages = []
    for item in reversed(raw):  # LPUSH puts the newest first
        message = json.loads(item)
        body = base64.b64decode(message["body"])
        messages.append((message["headers"]["task"], loads(body, message["content-type"], message["content-encoding"])))
    return messages


def test_each_node_gets_one_launch_message_naming_the_work_placed_on_it_all_signed_once(user):
    import json

    import redis
    from django.conf import settings

    from core.messages import ToNode, node_queue, send

    nodes = [make_node("sim:1xRTX3090", cpu_cores=8) for _ in range(3)]
    works = [workload(user, name=f"w{i}") for i in range(3)]
    client = redis.Redis.from_url(settings.REDIS_URL)

    placed = tick.schedule_tick().placed

    assert sorted(placed) == sorted(w.pk for w in works)
    raw = [client.lrange(node_queue(node.name), 0, -1) for node in nodes]
    launched = {}
    for node in nodes:
        [(task, ((launches,), _, _))] = queued_messages(node_queue(node.name))
        assert task == ToNode.LAUNCH_MANY
        launched[node.name] = launches[node.name]
    for w in Workload.objects.filter(pk__in=placed).select_related("node"):
        assert launched[w.node.name] == [w.pk]
    # One signed body, a message of its own (its own id) on each node's queue.
    messages = [json.loads(item) for [item] in raw]
    assert len({m["body"] for m in messages}) == 1
    assert len({m["headers"]["id"] for m in messages}) == 3
    # Each copy is the message Celery's own send_task makes (the same headers and properties), with its own id.
    send(ToNode.LAUNCH_MANY, {}, node=nodes[0].name)
    made_by_celery = json.loads(client.lpop(node_queue(nodes[0].name)))
    for m in messages:
        assert m["headers"]["id"] == m["headers"]["root_id"] == m["properties"]["correlation_id"]
        assert m["headers"].keys() == made_by_celery["headers"].keys()
        assert m["properties"].keys() == made_by_celery["properties"].keys()
        assert m["properties"]["delivery_mode"] == made_by_celery["properties"]["delivery_mode"]
        assert m["properties"]["delivery_info"] == {**made_by_celery["properties"]["delivery_info"], "routing_key": ANY}
        assert {k: m[k] for k in m if k not in ("body", "headers", "properties")} == {
            k: made_by_celery[k] for k in made_by_celery if k not in ("body", "headers", "properties")
        }


def test_the_nodes_launches_in_one_body_are_split_so_a_message_stays_small(user, monkeypatch):
    from core.messages import node_queue
    from scheduler.services import workloads as workload_services

    monkeypatch.setattr(workload_services, "LAUNCH_NODES_PER_BODY", 2)
    nodes = [make_node("sim:1xRTX3090", cpu_cores=8) for _ in range(3)]
    for i in range(3):
        workload(user, name=f"w{i}")

    assert len(tick.schedule_tick().placed) == 3

    bodies = [queued_messages(node_queue(node.name))[0][1][0][0] for node in nodes]
    assert sorted(len(launches) for launches in bodies) == [1, 2, 2]
    for node, launches in zip(nodes, bodies, strict=True):
        assert node.name in launches


def test_a_tick_runs_with_the_garbage_collector_paused_and_turns_it_back_on(monkeypatch):
    seen = []
    monkeypatch.setattr(tick, "_tick", lambda: seen.append(gc.isenabled()) or tick.TickResult())
    assert gc.isenabled()

    tick.schedule_tick()

    assert seen == [False] and gc.isenabled()


class _Held:
    """An object the collector tracks, that a weak reference can watch."""


@pytest.fixture
def nothing_frozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def _frozen(obj) -> bool:
    return not any(o is obj for o in gc.get_objects())  # the collector's generations leave frozen objects out


def test_a_tick_freezes_what_it_keeps_and_collects_what_it_dropped_in_cycles(monkeypatch, nothing_frozen):
    """The tick's kept state (~200,000 objects with Django's) was scanned by every full collection: 110-130 ms,
    landing on one tick in ten. At the tick's end its cyclic garbage is collected and the survivors frozen."""
    kept, dropped = [], []

    def a_tick():
        kept.append(_Held())
        cycle = _Held()
        cycle.itself = cycle
        dropped.append(weakref.ref(cycle))
        return tick.TickResult()

    monkeypatch.setattr(tick, "_tick", a_tick)
    tick.schedule_tick()

    assert _frozen(kept[0])
    assert dropped[0]() is None  # collected before the freeze, not kept out of reach with the survivors
    assert gc.isenabled()


def test_what_was_frozen_goes_back_to_the_collector_after_a_while(monkeypatch, nothing_frozen):
    from core import memory

    with collector_paused(freeze=True):
        old = _Held()
        old.itself = old
    watch = weakref.ref(old)
    del old  # cyclic garbage now, out of the collector's reach while frozen
    with collector_paused(freeze=True):
        pass
    assert watch() is not None

    monkeypatch.setattr(memory, "UNFREEZE_S", 0.0)
    with collector_paused(freeze=True):
        pass
    assert watch() is None


def test_nothing_is_frozen_where_someone_else_paused_the_collector(nothing_frozen):
    gc.disable()  # as a settlement running on the worker's other thread does
    try:
        with collector_paused(freeze=True):
            made = _Held()
        assert not _frozen(made) and gc.get_freeze_count() == 0 and not gc.isenabled()
    finally:
        gc.enable()


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
