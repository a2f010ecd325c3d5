"""The web terminal: a real shell in the owner's running container over a real WebSocket.

daphne runs with no Docker engine to reach (as in production): the shell comes through the node's relay.
"""

import asyncio
import json
from decimal import Decimal

import pytest
import websockets
import websockets.exceptions  # the package does not import it itself until a connection does

from billing.ledger import team_account, wallet_credit
from billing.models import Membership
from billing.teams import member_add, member_remove, team_create, team_get
from portal.models import Instance
from portal.services.relay import SessionSlot
from scheduler.services.workloads import workload_stop
from tests.conftest import wait_status
from tests.portal.test_instance_api import create
from tests.portal.test_live_updates import session_cookie

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


async def read_until(ws, screen: list[str], text: str, timeout: float = 15) -> None:
    """Read output into ``screen[0]`` until it shows ``text`` (output chunks split anywhere)."""

    async def read():
        while text not in screen[0]:
            screen[0] += (await ws.recv()).decode(errors="replace")

    await asyncio.wait_for(read(), timeout)


async def closed_with(url: str, headers: dict, timeout: float = 10) -> int:
    """Connect (or keep reading) and return the code the server closes the socket with."""
    async with websockets.connect(url, additional_headers=headers) as ws:
        return await closing_code(ws, timeout)


async def closing_code(ws, timeout: float) -> int:
    return (await closing(ws, timeout))[0]


async def closing(ws, timeout: float) -> tuple[int, dict | None]:
    """The code the server closes with, and the platform's last text frame before it (why it closed)."""
    said = None
    with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
        while True:
            frame = await asyncio.wait_for(ws.recv(), timeout)
            if isinstance(frame, str):
                said = json.loads(frame)
    return closed.value.rcvd.code, said


@pytest.fixture
def terminal(api, user, catalog, node_worker, web_server):
    """A running instance of ``user``'s: (instance, its terminal's URL, the owner's headers)."""
    assert create(api, catalog).status_code == 201
    instance = Instance.objects.get()
    wait_status(instance.workload, "running", timeout=30)
    url = f"ws://{web_server}/ws/terminal/instances/{instance.pk}/"
    return instance, url, {"Origin": "http://127.0.0.1", "Cookie": session_cookie(user)}


def test_the_owner_runs_a_command_in_the_container_and_the_terminal_closes_when_it_stops(terminal, outsider):
    instance, url, mine = terminal
    theirs = {"Origin": "http://127.0.0.1", "Cookie": session_cookie(outsider)}

    async def session():
        async with websockets.connect(url, additional_headers=mine) as ws:
            await ws.send(json.dumps({"type": "resize", "cols": 100, "rows": 30}))
            await ws.send(
                json.dumps(
                    {
                        "type": "input",
                        "data": "echo hello-$((6*7)) > /root/autodl-tmp/f; cat /root/autodl-tmp/f; stty size\n",
                    }
                )
            )
            screen = [""]
            await read_until(ws, screen, "hello-42\r\n")
            await read_until(ws, screen, "30 100")  # the resize reached the TTY
            await asyncio.to_thread(stop)
            closed = await closing(ws, 30)
        return screen[0], closed, await closed_with(url, theirs)

    def stop():
        from django.db import connection

        try:
            workload_stop(instance.workload)
        finally:
            connection.close()

    screen, (closed_code, why), refused_code = asyncio.run(session())
    assert "hello-42" in screen
    assert closed_code == 4000, "the shell's end closes the terminal cleanly"
    assert why == {"closed": 4000, "why": "stopped", "reason": "the instance stopped"}, "the page can say why"
    assert refused_code == 4404
    wait_status(instance.workload, "stopped", timeout=30)
    assert asyncio.run(closed_with(url, mine)) == 4409


def test_a_terminal_beyond_the_users_session_cap_is_refused_with_4429_until_one_ends(terminal, user, settings):
    _, url, mine = terminal
    held = [SessionSlot(user.pk).take() for _ in range(settings.RELAY_MAX_SESSIONS_PER_USER)]  # e.g. downloads

    async def works():
        async with websockets.connect(url, additional_headers=mine) as ws:
            await ws.send(json.dumps({"type": "input", "data": "echo ok-$((6*7))\n"}))
            await read_until(ws, [""], "ok-42")
            await ws.send(json.dumps({"type": "input", "data": "exit 3\n"}))
            return await closing(ws, 15)

    try:
        assert asyncio.run(closed_with(url, mine)) == 4429
        held.pop().release()
        assert asyncio.run(works()) == (4000, {"closed": 4000, "why": "exited", "reason": "the shell exited"})
    finally:
        for slot in held:
            slot.release()


async def closed_after(url: str, headers: dict, change) -> tuple[int, dict | None]:
    """Open a live terminal, run ``change`` (a database write) in a thread, and return how the terminal closed."""

    def write():
        from django.db import connection

        try:
            change()
        finally:
            connection.close()

    async with websockets.connect(url, additional_headers=headers) as ws:
        await ws.send(json.dumps({"type": "input", "data": "echo live-$((6*7))\n"}))
        await read_until(ws, [""], "live-42")
        await asyncio.to_thread(write)
        return await closing(ws, 10)


def test_a_new_password_closes_the_users_open_terminal(terminal, user):
    _, url, mine = terminal

    def new_password():
        user.set_password("a-new-password-0123")
        user.save()

    code, why = asyncio.run(closed_after(url, mine, new_password))
    assert (code, why["why"]) == (4401, "revoked") and "password changed" in why["reason"]


def test_deactivating_the_user_closes_their_open_terminal(terminal, user):
    _, url, mine = terminal

    def deactivate():
        user.is_active = False
        user.save(update_fields=["is_active"])

    code, why = asyncio.run(closed_after(url, mine, deactivate))
    assert (code, why["why"]) == (4401, "revoked") and "deactivated" in why["reason"]


def test_leaving_the_team_closes_the_terminal_of_work_it_pays_for(
    user, outsider, outsider_api, catalog, node_worker, web_server
):
    team = team_get(user=user, slug=team_create(user=user, name="NLP").slug)  # as the admin sees it
    member_add(team=team, by=user, username=outsider.username)
    wallet_credit(account=team_account(team), amount=Decimal(100), kind="topup", memo="t", by=None)
    assert create(outsider_api, catalog, team=team.slug).status_code == 201
    instance = Instance.objects.get()
    wait_status(instance.workload, "running", timeout=30)
    url = f"ws://{web_server}/ws/terminal/instances/{instance.pk}/"
    theirs = {"Origin": "http://127.0.0.1", "Cookie": session_cookie(outsider)}
    membership = Membership.objects.get(team=team, user=outsider)

    leave = lambda: member_remove(team=team, by=user, member_id=membership.pk)  # noqa: E731
    code, why = asyncio.run(closed_after(url, theirs, leave))
    assert (code, why["why"]) == (4403, "revoked") and "no longer a member of team nlp" in why["reason"]
