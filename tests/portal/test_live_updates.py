"""Instance status changes reach the owner's browser over a real WebSocket (daphne + Redis)."""

import asyncio
import json
import time

import pytest
import websockets
import websockets.exceptions  # the package does not import it itself until a connection does
from django.db import connection
from django.test import Client

from scheduler.services.lifecycle import workload_transition
from tests.portal.test_instance_api import create

pytestmark = pytest.mark.django_db(transaction=True)


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def test_the_owner_gets_a_status_change_live_and_an_outsider_does_not(
    api, user, outsider, catalog, sim_node, web_server
):
    instance_id = create(api, catalog).data["id"]
    workload = user.workloads.get()
    url = f"ws://{web_server}/ws/instances/"
    mine_headers = {"Origin": "http://127.0.0.1", "Cookie": session_cookie(user)}
    theirs_headers = {"Origin": "http://127.0.0.1", "Cookie": session_cookie(outsider)}

    async def scenario():
        async with (
            websockets.connect(url, additional_headers=mine_headers) as mine,
            websockets.connect(url, additional_headers=theirs_headers) as theirs,
        ):
            await asyncio.sleep(0.5)
            started = time.monotonic()
            await asyncio.to_thread(change_status)
            message = json.loads(await asyncio.wait_for(mine.recv(), 10))
            latency = time.monotonic() - started
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(theirs.recv(), 1)
            return message, latency

    def change_status():
        try:
            workload_transition(workload, to="stopped", allowed_from=["queued"], reason="stopped while queued")
        finally:
            connection.close()

    message, latency = asyncio.run(scenario())
    assert message == {"instance": instance_id, "status": "stopped", "reason": "stopped while queued"}
    assert latency < 10


def test_an_anonymous_websocket_is_refused(web_server):
    async def connect():
        async with websockets.connect(
            f"ws://{web_server}/ws/instances/", additional_headers={"Origin": "http://127.0.0.1"}
        ) as ws:
            await ws.recv()

    with pytest.raises(websockets.exceptions.ConnectionClosed) as refused:
        asyncio.run(connect())
    assert refused.value.rcvd.code == 4401


def test_on_a_host_the_control_plane_pushes_the_status(api, user, catalog, sim_node, web_server, settings, monkeypatch):
    """A GPU host's Redis user may not publish to users' groups (core.redis_acl): a status change made on a host
    asks the scheduler worker, which pushes what its records hold then."""
    from core import messages
    from portal import receivers
    from portal.tasks import instance_status_push

    settings.NODE_NAME = "h1"
    asked = []
    monkeypatch.setattr(receivers.messages, "send", lambda task, *args, **kw: asked.append((task, *args)))
    instance_id = create(api, catalog).data["id"]
    workload = user.workloads.get()
    headers = {"Origin": "http://127.0.0.1", "Cookie": session_cookie(user)}

    def change_status():
        try:
            workload_transition(workload, to="stopped", allowed_from=["queued"], reason="stopped on the host")
        finally:
            connection.close()

    def push():
        try:
            instance_status_push(workload.pk)  # as the scheduler worker runs it
        finally:
            connection.close()

    async def scenario():
        async with websockets.connect(f"ws://{web_server}/ws/instances/", additional_headers=headers) as mine:
            await asyncio.sleep(0.5)
            await asyncio.to_thread(change_status)
            with pytest.raises(TimeoutError):  # the host itself published nothing
                await asyncio.wait_for(mine.recv(), 1)
            await asyncio.to_thread(push)
            return json.loads(await asyncio.wait_for(mine.recv(), 10))

    message = asyncio.run(scenario())
    assert asked == [(messages.ToScheduler.INSTANCE_STATUS_PUSH, workload.pk)]
    assert message == {"instance": instance_id, "status": "stopped", "reason": "stopped on the host"}
