"""The relay in real processes: a web server with no Docker, the node agent's relay, and the agent killed.

The cluster's daphne has no Docker engine to reach (tests/faults/conftest.py); the terminal
and a download go through the relay the agent process serves. When the agent is killed, an
open terminal closes with 4000 and a new one is refused with 4409 (not a hang, not a 500);
once the agent is back it serves again, at the URL it registers anew.
"""

import asyncio
import json

import pytest
import requests
import websockets

from scheduler.models import Node
from tests.conftest import wait_for, wait_status
from tests.portal.test_live_updates import session_cookie
from tests.portal.test_terminal import closed_with, closing_code, read_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


@pytest.fixture
def cluster_env():
    """The node is not declared lost while its agent is down for a moment: this is about the relay."""
    return {"NODE_LOST_AFTER_S": "120"}


def test_the_agents_relay_serves_terminal_and_files_and_its_death_closes_them_cleanly(cluster, catalog, user):
    w = cluster.create_instance(catalog)
    wait_status(w, "running", timeout=60)
    instance = w.instance.pk
    cookie = session_cookie(user)
    url = f"ws://127.0.0.1:{cluster.web_port}/ws/terminal/instances/{instance}/"
    headers = {"Origin": "http://127.0.0.1", "Cookie": cookie}

    async def shell_then_agent_killed():
        async with websockets.connect(url, additional_headers=headers) as ws:
            await ws.send(json.dumps({"type": "input", "data": "echo relayed-$((6*7)) | tee /root/autodl-tmp/f\n"}))
            await read_until(ws, [""], "relayed-42\r\n")
            download = await asyncio.to_thread(
                requests.get,
                f"http://127.0.0.1:{cluster.web_port}/instances/{instance}/files/download/",
                params={"path": "/root/autodl-tmp/f"},
                headers={"Cookie": cookie},
                timeout=30,
            )
            assert download.status_code == 200 and download.content == b"relayed-42\n"
            await asyncio.to_thread(cluster.kill, "agent")
            closed = await closing_code(ws, 60)
        return closed, await closed_with(url, headers, 30)

    assert asyncio.run(shell_then_agent_killed()) == (4000, 4409)
    epoch = Node.objects.get(name=cluster.node_name).epoch
    cluster.start("agent")
    wait_for(lambda: Node.objects.get(name=cluster.node_name).epoch > epoch, timeout=30, what="the agent to register")

    async def shell_again():
        async with websockets.connect(url, additional_headers=headers) as ws:
            await ws.send(json.dumps({"type": "input", "data": "cat /root/autodl-tmp/f\n"}))
            await read_until(ws, [""], "relayed-42\r\n")

    asyncio.run(shell_again())
