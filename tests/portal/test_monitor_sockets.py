"""Monitor sockets on a real daphne: many viewers share one receive per sample, and open on a compact backfill."""

import asyncio
import itertools
import json
import time

import pytest
import redis
import websockets
import websockets.exceptions  # the package does not import it itself until a connection does

from agent.telemetry.sampler import Sampler
from agent.telemetry.simgpu import SimulatedBackend
from scheduler.telemetry import streams
from tests.agent.telemetry.test_sampler import running_on
from tests.conftest import make_node
from tests.portal.test_live_updates import session_cookie

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
VIEWERS = 12


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("ops", password="ops-pass-123", is_staff=True)


@pytest.fixture
def node(user):
    """An 8-card simulated node with a tenant on each card (its documents list them: ~4 KB)."""
    node = make_node("sim:8xA100-80GB")
    for card in node.gpus.order_by("index"):
        running_on(node, user, card, 500)
    return node


def sample(sampler) -> dict:
    """One sample, from a thread of the test's event loop (its database connection closed after)."""
    from django.db import connection

    try:
        return sampler.sample_once()
    finally:
        connection.close()


def headers(user) -> dict:
    return {"Origin": "http://127.0.0.1", "Cookie": session_cookie(user)}


def test_every_viewer_gets_its_backfill_then_each_sample_once_in_order(web_server, node, staff, user):
    sampler = Sampler(node, backend=SimulatedBackend(), docker_client=None)
    first = sampler.sample_once()
    url = f"ws://{web_server}/ws/monitor/nodes/{node.name}/"
    viewers = [headers(staff) for _ in range(VIEWERS)]  # a session each, as many browsers hold
    not_staff = headers(user)

    async def scenario():
        sockets = [await websockets.connect(url, additional_headers=h) for h in viewers]
        backfills = [json.loads(await asyncio.wait_for(ws.recv(), 10)) for ws in sockets]
        published = [(await asyncio.to_thread(sample, sampler))["t"] for _ in range(4)]
        received = [[json.loads(await asyncio.wait_for(ws.recv(), 10))["t"] for _ in published] for ws in sockets]
        for ws in sockets[: VIEWERS // 2]:  # half of them leave: the others still get what follows
            await ws.close()
        later = (await asyncio.to_thread(sample, sampler))["t"]
        after = [json.loads(await asyncio.wait_for(ws.recv(), 10))["t"] for ws in sockets[VIEWERS // 2 :]]
        for ws in sockets[VIEWERS // 2 :]:
            await ws.close()
        async with websockets.connect(url, additional_headers=not_staff) as ws:
            with pytest.raises(websockets.exceptions.ConnectionClosed) as refused:
                await asyncio.wait_for(ws.recv(), 10)
        return backfills, published, received, later, after, refused.value.rcvd.code

    backfills, published, received, later, after, refused = asyncio.run(scenario())
    sampler.close()
    assert all(b["type"] == "history" and b["samples"][-1]["t"] == first["t"] for b in backfills)
    assert received == [published] * VIEWERS, "each sample once, in order (a repeat would shift the rest)"
    assert after == [later] * (VIEWERS - VIEWERS // 2)
    assert refused == 4403, "not staff: the node monitor refuses"


def test_a_socket_opened_after_a_long_history_gets_a_bounded_backfill(web_server, node, staff, settings):
    settings.TELEMETRY_HISTORY_S, settings.TELEMETRY_BACKFILL_POINTS = 120, 20  # the writer's window and points
    start = time.time() - 400
    clock = itertools.count(start)
    sampler = Sampler(node, backend=SimulatedBackend(), docker_client=None, clock=lambda: next(clock))
    for _ in range(400):  # over three windows of samples, one a second
        newest = sampler.sample_once()
    sampler.close()
    held = streams.history_read(streams.node_stream(node.name))
    url, mine = f"ws://{web_server}/ws/monitor/nodes/{node.name}/", headers(staff)

    async def first_message():
        async with websockets.connect(url, additional_headers=mine) as ws:
            return await asyncio.wait_for(ws.recv(), 10)

    text = asyncio.run(first_message())
    samples = json.loads(text)["samples"]
    times = [s["t"] for s in samples]
    assert len(held) >= 120 and len(text) < sum(map(len, held)) / 4, "the stream holds the window; the socket not"
    assert len(samples) <= 20 + 1, "the points, then the newest sample"
    assert samples[-1] == newest, "the newest sample whole (its holders, clocks: the page's table)"
    assert all("tenants" not in g for s in samples[:-1] for g in s["gpus"]), "points: what the charts draw"
    assert times == sorted(times) and times[0] <= newest["t"] - 100, "the points span the window"
    point = max(len(json.dumps(s, separators=(",", ":"))) for s in samples[:-1])
    assert len(text) <= 20 * point + len(json.dumps(newest, separators=(",", ":"))) + 64


def test_a_backfill_that_cannot_be_read_opens_the_socket_empty_and_samples_still_come(node, staff, monkeypatch):
    from channels.testing import WebsocketCommunicator

    from config.asgi import application

    def unreadable(key):
        raise redis.ConnectionError("Redis away")

    monkeypatch.setattr(streams, "backfill_read", unreadable)
    sampler = Sampler(node, backend=SimulatedBackend(), docker_client=None)
    cookie = session_cookie(staff).encode()

    async def scenario():
        headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1"), (b"cookie", cookie)]
        socket = WebsocketCommunicator(application, f"/ws/monitor/nodes/{node.name}/", headers=headers)
        connected, _ = await socket.connect(timeout=10)
        backfill = json.loads(await socket.receive_from(timeout=10))
        t = (await asyncio.to_thread(sample, sampler))["t"]
        live = json.loads(await socket.receive_from(timeout=10))
        await socket.disconnect()
        return connected, backfill, t, live

    connected, backfill, t, live = asyncio.run(scenario())
    sampler.close()
    assert connected and backfill == {"type": "history", "samples": []}
    assert live["t"] == t


def test_an_instance_monitor_watches_the_host_its_instance_is_on_and_follows_it(user, catalog):
    """Samples are named by host (a host's Redis user publishes to its own work's groups only): the socket of a
    queued instance waits for its placement, then follows it to another host on the control plane's status push."""
    from channels.layers import get_channel_layer
    from channels.testing import WebsocketCommunicator
    from django.db import connection

    from config.asgi import application
    from core import messages
    from portal.models import Instance
    from portal.receivers import instance_status_send
    from scheduler.models import Allocation, Workload, WorkloadStatus
    from scheduler.services.allocation import Share, allocation_create
    from tests.scheduler.factories import workload

    first, second = make_node("sim:1xRTX3090"), make_node("sim:1xRTX3090")
    queued = workload(user, gpu_model=first.gpus.get().model)
    instance = Instance.objects.create(
        owner=user, name="i", image=catalog["image"], gpu_type=catalog["rtx3090"], gpus=1, cpu_cores=1,
        memory_gb=1, disk_gb=10, workload=queued,
    )  # fmt: skip
    samplers = {n.name: Sampler(n, backend=SimulatedBackend(), docker_client=None) for n in (first, second)}

    def place(node) -> None:
        """The control plane puts the instance on ``node`` (its card whole) and pushes its status."""
        Allocation.objects.filter(workload=queued).delete()
        Workload.objects.filter(pk=queued.pk).update(status=WorkloadStatus.QUEUED, node=None)
        queued.refresh_from_db()
        card = node.gpus.get()
        assert allocation_create(workload=queued, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
        Workload.objects.filter(pk=queued.pk).update(status=WorkloadStatus.RUNNING)
        instance_status_send(user.pk, instance.pk, "running", "")
        connection.close()

    async def next_live(socket) -> dict:
        while True:
            message = json.loads(await socket.receive_from(timeout=10))
            if message.get("v") == 1:
                return message

    cookie = session_cookie(user).encode()
    forged = json.dumps({"v": 1, "t": time.time(), "node": first.name, "workload": queued.pk, "gpus": []})

    async def scenario():
        headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1"), (b"cookie", cookie)]
        socket = WebsocketCommunicator(application, f"/ws/monitor/instances/{instance.pk}/", headers=headers)
        connected, _ = await socket.connect(timeout=10)
        opened = json.loads(await socket.receive_from(timeout=10))
        await asyncio.to_thread(place, first)
        placed = json.loads(await socket.receive_from(timeout=10))  # the first host's history (none yet)
        on_first = await asyncio.to_thread(sample, samplers[first.name])
        live_first = await next_live(socket)
        await asyncio.to_thread(place, second)
        moved = json.loads(await socket.receive_from(timeout=10))
        # The first host, no longer the instance's, publishes for it: the socket left that host's group.
        await get_channel_layer().group_send(
            messages.workload_group(first.name, queued.pk), {"type": messages.TELEMETRY_SAMPLE, "doc": forged}
        )
        on_second = await asyncio.to_thread(sample, samplers[second.name])
        live_second = await next_live(socket)
        await socket.disconnect()
        return connected, opened, placed, on_first, live_first, moved, on_second, live_second

    connected, opened, placed, on_first, live_first, moved, on_second, live_second = asyncio.run(scenario())
    for sampler in samplers.values():
        sampler.close()
    assert connected and opened == {"type": "history", "samples": []}, "queued: no host, no samples"
    assert placed["type"] == "history"
    assert (live_first["node"], live_first["workload"], live_first["t"]) == (first.name, queued.pk, on_first["t"])
    assert moved["type"] == "history" and all(s["node"] == second.name for s in moved["samples"])
    assert (live_second["node"], live_second["t"]) == (second.name, on_second["t"]), "not the first host's"
