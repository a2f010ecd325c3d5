"""Web terminal: a shell in an instance's running container (``docker exec`` with a TTY) over a WebSocket.

Only the instance's owner gets one (staff and others: 4404; not signed in: 4401;
an instance that is not running: 4409). Frames from the browser are JSON text:
``{"type": "input", "data": "..."}`` or ``{"type": "resize", "cols": 80, "rows": 24}``;
the shell's output comes back as binary frames. When the shell exits or the
container stops, the socket closes with 4000 and a reason.

The web process talks to the Docker engine of the instance's node at
``DOCKER_BASE_URL``: on one host (``make run``, the tests) that is the local
engine; a multi-host deployment must expose each node's engine to the web
servers (README, "Web terminal").
"""

from __future__ import annotations

import asyncio
import json
import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from portal import selectors
from portal.consumers import NOT_FOUND, NOT_SIGNED_IN, refuse
from scheduler.errors import NotFound
from scheduler.models import WorkloadStatus
from scheduler.node.launcher import docker_client

log = logging.getLogger(__name__)
NOT_RUNNING, ENDED = 4409, 4000
SHELL = ["/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"]
READ_BYTES = 65536


class TerminalConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        self.sock = None
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await refuse(self, NOT_SIGNED_IN)
            return
        workload = await database_sync_to_async(self._workload)(user)
        if workload is None:
            await refuse(self, NOT_FOUND)
            return
        if workload.status != WorkloadStatus.RUNNING:
            await refuse(self, NOT_RUNNING)
            return
        try:
            self.exec_id, self.stream, self.sock = await asyncio.to_thread(_exec_shell, workload.container_name)
        except Exception as exc:  # the container went away between the check and the exec
            log.info("terminal for %s refused: %s", workload.container_name, exc)
            await refuse(self, NOT_RUNNING)
            return
        await self.accept()
        self.reader = asyncio.create_task(self._pump())

    def _workload(self, user):
        try:
            instance_id = self.scope["url_route"]["kwargs"]["instance_id"]
            return selectors.instance_get_owned(user=user, instance_id=instance_id).workload
        except NotFound:
            return None

    async def _pump(self):
        loop = asyncio.get_running_loop()
        try:
            while data := await loop.sock_recv(self.sock, READ_BYTES):
                await self.send(bytes_data=data)
        except OSError:
            pass
        await self.close(code=ENDED, reason="the shell ended (exit, or the instance stopped)")

    async def receive(self, text_data=None, bytes_data=None):
        try:
            message = json.loads(text_data or bytes_data or b"{}")
        except ValueError:
            return
        if message.get("type") == "input" and isinstance(message.get("data"), str):
            await asyncio.get_running_loop().sock_sendall(self.sock, message["data"].encode())
        elif message.get("type") == "resize":
            cols, rows = _size(message.get("cols")), _size(message.get("rows"))
            if cols and rows:
                await asyncio.to_thread(docker_client().api.exec_resize, self.exec_id, height=rows, width=cols)

    async def disconnect(self, code):
        if self.sock is not None:
            if hasattr(self, "reader"):
                self.reader.cancel()
            self.sock.close()  # the shell reads EOF and exits
            self.stream.close()


def _exec_shell(container_name: str):
    api = docker_client().api
    exec_id = api.exec_create(
        container_name, SHELL, stdin=True, tty=True, environment={"TERM": "xterm-256color"}, workdir="/root"
    )["Id"]
    stream = api.exec_start(exec_id, tty=True, socket=True)  # kept: it owns the connection
    raw = stream._sock
    raw.setblocking(False)
    return exec_id, stream, raw


def _size(value) -> int | None:
    return value if isinstance(value, int) and 1 <= value <= 1000 else None
