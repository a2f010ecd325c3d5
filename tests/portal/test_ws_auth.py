"""WebSocket sockets for scripts: ``Authorization: Token <key>`` on the handshake (portal/sockets/auth.py)."""

import asyncio

import pytest
from channels.testing import WebsocketCommunicator

from config.asgi import application
from portal.models import ApiToken
from portal.services.tokens import token_create

pytestmark = pytest.mark.django_db(transaction=True)


def handshake(headers: list[tuple[bytes, bytes]], path: str = "/ws/instances/"):
    """(connected, the close code if the server closed at once, else None)."""

    async def run():
        communicator = WebsocketCommunicator(application, path, headers=[(b"host", b"127.0.0.1"), *headers])
        connected, _ = await communicator.connect(timeout=10)
        if not connected:
            return False, None
        if await communicator.receive_nothing(timeout=0.5):
            await communicator.disconnect()
            return True, None
        while (said := await communicator.receive_output(timeout=5))["type"] == "websocket.send":
            pass  # a terminal says why in a text frame before it closes
        return True, said.get("code")

    return asyncio.run(run())


def test_a_script_with_its_token_gets_a_socket_without_a_browser_origin(user):
    token, key = token_create(user=user, name="script")
    assert handshake([(b"authorization", f"Token {key}".encode())]) == (True, None)
    ApiToken.objects.filter(pk=token.pk).update(expires_at=token.created_at)
    assert handshake([(b"authorization", f"Token {key}".encode())]) == (True, 4401), "expired: signed out"


def test_a_wrong_token_is_refused_as_the_signed_out_are_even_with_a_session_cookie(user, client):
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    refused = handshake([(b"authorization", b"Token wrong"), (b"cookie", cookie), (b"origin", b"http://127.0.0.1")])
    assert refused == (True, 4401)


def test_without_a_token_the_origin_check_still_guards_cookie_sockets(user, client):
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    assert handshake([(b"cookie", cookie)])[0] is False, "no Origin: refused"
    assert handshake([(b"cookie", cookie), (b"origin", b"http://evil.example")])[0] is False
    assert handshake([(b"cookie", cookie), (b"origin", b"http://127.0.0.1")]) == (True, None)


def test_another_users_token_does_not_open_my_terminal(user, outsider, catalog, sim_node):
    from decimal import Decimal

    from portal.services import work
    from portal.services.requests import JobRequest

    job = work.job_create(JobRequest(
        owner=user, name="x", image_id=catalog["image"].pk, gpu_type_id=catalog["rtx3090"].pk,
        gpus=Decimal("0.5"), cpu_cores=1, memory_gb=1, command="sleep 60",
    ))  # fmt: skip
    _, theirs = token_create(user=outsider, name="theirs")
    _, mine = token_create(user=user, name="mine")
    path = f"/ws/terminal/jobs/{job.pk}/"
    assert handshake([(b"authorization", f"Token {theirs}".encode())], path) == (True, 4404)
    assert handshake([(b"authorization", f"Token {mine}".encode())], path) == (True, 4409), "queued: not running"
