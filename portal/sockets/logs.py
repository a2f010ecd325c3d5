"""Following a log live: ws/logs/jobs/<id>/ and ws/logs/instances/<id>/ (daphne).

The query is the HTTP API's (``after``, ``tail``, ``since``). Each line object goes as one text
frame; once the work has finished and every line is sent, the ``{"end": ...}`` frame, then close
1000. A client that reconnects with ``after=<the last n it got>`` gets no line twice and loses none.
Refusals close with a code: 4401 not signed in, 4404 not the owner's (or none), 4400 a bad query,
4409 a host that does not answer, 4429 too many relay sessions (a follow holds one of the user's).

The reading (``portal.services.logs.log_lines``: blocking HTTP to the relays, the database) runs on a thread
of its own per socket; each frame waits for the socket's send, so a slow browser slows the read
instead of filling memory.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db import connection

from core.errors import InvalidInput, NotFound, ServiceError, TooMany
from portal.services import logs
from portal.services.relay import RENEW_S, SessionSlot
from portal.sockets.monitor import NOT_FOUND, NOT_SIGNED_IN, refuse

log = logging.getLogger(__name__)
BAD_QUERY, UNREACHABLE, TOO_MANY, DONE = 4400, 4409, 4429, 1000
SEND_S = 60  # the longest wait for the browser to take a frame


class LogFollowConsumer(AsyncWebsocketConsumer):
    kind = ""  # "jobs" or "instances"

    async def connect(self):
        self.alive, self.slot = True, None
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await refuse(self, NOT_SIGNED_IN)
            return
        params = {k: v[0] for k, v in parse_qs(self.scope.get("query_string", b"").decode()).items()}
        object_id = self.scope["url_route"]["kwargs"]["job_id" if self.kind == "jobs" else "instance_id"]
        try:
            workload = await database_sync_to_async(logs.log_workload)(user=user, kind=self.kind, object_id=object_id)
            query = logs.query_parse(params, follow=True)
        except NotFound:
            await refuse(self, NOT_FOUND)
            return
        except InvalidInput as exc:
            await self._refuse(BAD_QUERY, f"{exc.field}: {exc.message}")
            return
        try:
            self.slot = await asyncio.to_thread(SessionSlot(user.pk).take)
        except TooMany as exc:
            await self._refuse(TOO_MANY, exc.message)
            return
        await self.accept()
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._read, args=(workload, query, loop), name="log-follow", daemon=True).start()

    async def _refuse(self, code: int, reason: str) -> None:
        await self.accept()
        await self.close(code=code, reason=reason.encode()[:120].decode(errors="ignore"))

    def _read(self, workload, query: logs.Query, loop: asyncio.AbstractEventLoop) -> None:
        def on_loop(coroutine):
            return asyncio.run_coroutine_threadsafe(coroutine, loop).result(SEND_S)

        renewed = time.monotonic()
        try:
            for line in logs.log_lines(workload, query=query, alive=lambda: self.alive):
                if not self.alive:
                    return
                on_loop(self.send(text_data=line.decode().rstrip("\n")))
                if time.monotonic() - renewed > RENEW_S:
                    self.slot.renew()
                    renewed = time.monotonic()
            if self.alive:
                on_loop(self.close(code=DONE))
        except ServiceError as exc:
            if self.alive:
                on_loop(self.close(code=UNREACHABLE, reason=exc.message.encode()[:120].decode(errors="ignore")))
        except Exception:  # the socket went away while a frame waited, or a fault: the client reconnects
            log.exception("following the log of workload %s failed", workload.pk)
            if self.alive:
                asyncio.run_coroutine_threadsafe(self.close(code=1011), loop)
        finally:
            connection.close()
            if self.slot is not None:
                self.slot.release()

    async def disconnect(self, code):
        self.alive = False


class JobLogConsumer(LogFollowConsumer):
    kind = "jobs"


class InstanceLogConsumer(LogFollowConsumer):
    kind = "instances"
