"""Web terminal: a shell in an instance's (or a running job's) container over a WebSocket, through its host's relay.

Routes: ws/terminal/instances/<id>/ and ws/terminal/jobs/<id>/. Only the owner gets
one (staff and others: 4404; not signed in: 4401; work that is not running, or
whose host does not answer: 4409; a user who already holds
RELAY_MAX_SESSIONS_PER_USER terminal and file sessions: 4429). An open terminal closes when its
user's access ends (``terminals_revoke``): 4401 when their password changes or they are deactivated,
4403 when they leave the team its work is charged to.
Frames from the browser are JSON text: ``{"type": "input", "data": "..."}`` or
``{"type": "resize", "cols": 80, "rows": 24}``; the shell's output comes back as
binary frames. When the shell exits or the container stops, the socket closes
with 4000 and a reason; a shell that exited sends the text frame
``{"exit_code": N}`` just before (core/relay.py), for the CLI's ``exec``.
Every close of ours is preceded by the text frame ``{"closed": code, "why": ..., "reason": "..."}``
(``why``: ``stopped`` — the instance or job stopped —, ``exited``, ``ended``, ``revoked``, or ``refused``): daphne
drops a close frame's reason, so the page reads why from that frame (``instance_terminal.js``).

This process never talks to Docker: it opens a WebSocket to the relay of the
node holding the container (``agent/relay/terminal.py``) with a signed
ticket, and passes frames both ways unchanged.
"""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from core import messages
from core.errors import NotFound, ServiceError, TooMany
from core.relay import SHELL_ENDED, Op
from portal import selectors
from portal.services.relay import CONNECT_S, RENEW_S, SessionSlot, relay_target
from portal.sockets.monitor import NOT_FOUND, NOT_SIGNED_IN, NOT_STAFF, refuse
from scheduler.models import Workload, WorkloadStatus

log = logging.getLogger(__name__)
NOT_RUNNING, TOO_MANY, ENDED, LEFT_TEAM = 4409, 4429, SHELL_ENDED, NOT_STAFF


class TerminalConsumer(AsyncWebsocketConsumer):
    kind = "instance"

    async def connect(self):
        self.relay = self.http = self.slot = self.group = None
        self.tasks: list[asyncio.Task] = []
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await refuse(self, NOT_SIGNED_IN)
            return
        # Joined first: a revoke sent while this connects waits in the channel and closes the socket right after.
        self.group = messages.terminals_group(user.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        try:
            url, headers, pin = await database_sync_to_async(self._target)(user)
        except NotFound:
            await refuse(self, NOT_FOUND)
            return
        except ServiceError as exc:
            await self._refuse(NOT_RUNNING, exc.message)
            return
        try:
            self.slot = await asyncio.to_thread(SessionSlot(user.pk).take)
        except TooMany as exc:
            await self._refuse(TOO_MANY, exc.message)
            return
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_S))
        try:
            # Over TLS, the host's registered certificate and no other (core/relay_tls.py).
            pinned = aiohttp.Fingerprint(bytes.fromhex(pin)) if pin else True
            self.relay = await self.http.ws_connect(
                url, headers=headers, heartbeat=30, max_msg_size=1 << 20, ssl=pinned
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("terminal relay %s refused: %s", url.split("?")[0], exc)
            await self._end()
            await self._refuse(NOT_RUNNING, "the instance's host did not open a shell")
            return
        await self.accept()
        self.tasks = [asyncio.create_task(self._pump()), asyncio.create_task(self._renew())]

    def _target(self, user):
        instance_id = self.scope["url_route"]["kwargs"]["instance_id"]
        workload = selectors.instance_get_owned(user=user, instance_id=instance_id).workload
        self.workload_id, self.team = workload.pk, workload.team
        return relay_target(workload=workload, user=user, op=Op.TERMINAL)

    async def _refuse(self, code: int, reason: str) -> None:
        await self.accept()
        await self._close(code, "refused", reason)

    async def _close(self, code: int, why: str, reason: str) -> None:
        """Say why in a text frame, then close: daphne drops the reason of a close frame."""
        await self.send(text_data=json.dumps({"closed": code, "why": why, "reason": reason}))
        await self.close(code=code, reason=reason.encode()[:120].decode(errors="ignore"))

    async def _pump(self):
        """The relay's frames to the browser; the relay's close (the shell ended) closes the browser's socket."""
        exited = False
        while (frame := await self.relay.receive()).type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
            if frame.type == aiohttp.WSMsgType.TEXT:  # {"exit_code": N}: the shell's last word
                exited = True
                await self.send(text_data=frame.data)
            else:
                await self.send(bytes_data=frame.data)
        said = frame.extra if frame.type == aiohttp.WSMsgType.CLOSE and isinstance(frame.extra, str) else ""
        why, reason = await database_sync_to_async(self._why_ended)(exited, said)
        await self._close(ENDED, why, reason)

    def _why_ended(self, exited: bool, said: str) -> tuple[str, str]:
        """Why the shell went, in words: the work stopped (its status says so), the shell exited, or the host."""
        status = Workload.objects.filter(pk=self.workload_id).values_list("status", flat=True).first()
        if status != WorkloadStatus.RUNNING:
            return "stopped", f"the {self.kind} stopped"
        if exited:
            return "exited", "the shell exited"
        return "ended", said or "the connection to the instance's host ended"

    async def _renew(self):
        while True:
            await asyncio.sleep(RENEW_S)
            await asyncio.to_thread(self.slot.renew)

    async def receive(self, text_data=None, bytes_data=None):
        if self.relay is None or self.relay.closed:
            return
        if text_data is not None:
            await self.relay.send_str(text_data)
        elif bytes_data:
            await self.relay.send_bytes(bytes_data)

    async def terminal_revoke(self, event):
        """The user's access ended (``terminals_revoke``): all their terminals, or those of one team's work."""
        if self.relay is None or self.relay.closed or (event["team"] is not None and event["team"] != self.team):
            return
        await self._end()
        await self._close(LEFT_TEAM if event["team"] else NOT_SIGNED_IN, "revoked", event["reason"])

    async def disconnect(self, code):
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        await self._end()

    async def _end(self):
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        if self.relay is not None:
            await self.relay.close()  # the shell reads EOF and exits
        if self.http is not None:
            await self.http.close()
        if self.slot is not None:
            await asyncio.to_thread(self.slot.release)
            self.slot = None


class JobTerminalConsumer(TerminalConsumer):
    """A shell in the owner's running batch job (beside its command, in the same container)."""

    kind = "job"

    def _target(self, user):
        job_id = self.scope["url_route"]["kwargs"]["job_id"]
        workload = selectors.job_get_owned(user=user, job_id=job_id).workload
        self.workload_id, self.team = workload.pk, workload.team
        return relay_target(workload=workload, user=user, op=Op.TERMINAL)
