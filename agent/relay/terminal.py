"""The relay's terminal: a shell in the container (``docker exec`` with a TTY) over a WebSocket.

The web tier's consumer passes the browser's frames on unchanged: JSON text
``{"type": "input", "data": "..."}`` or ``{"type": "resize", "cols": 80, "rows": 24}``.
The shell's output goes back as binary frames, written as soon as it is read
(keystroke echo is one socket read and one frame). When the shell exits, the
container stops or the session reaches RELAY_TERMINAL_MAX_S, the socket closes
with SHELL_ENDED and a reason; when the shell exited, a last text frame
``{"exit_code": N}`` comes just before that close (the CLI's ``exec`` exits with it).
When the other side closes, the shell reads EOF.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import WSMsgType, web
from django.conf import settings

from agent.launcher import LABEL
from agent.relay.guard import Call, Refused, start
from core.errors import Conflict
from core.relay import HOME, SHELL_ENDED
from scheduler.models import WorkloadKind

log = logging.getLogger(__name__)
SHELL = ["/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"]
READ_BYTES = 65536
EXIT_POLLS, EXIT_POLL_S = 40, 0.05  # at most 2 s for Docker to note the shell's exit


async def terminal(request: web.Request, call: Call) -> web.WebSocketResponse:
    try:
        exec_id, stream, sock = await call.run(_exec_shell, call.api, call.ticket.container)
    except Refused:
        raise
    except Exception as exc:  # the container stopped between the check and the exec
        raise Conflict(f"no shell: {exc}") from exc
    ws = web.WebSocketResponse(heartbeat=30, max_msg_size=1 << 20)
    try:
        await start(request, ws)
        output = asyncio.create_task(_shell_to_socket(sock, ws))
        keys = asyncio.create_task(_socket_to_shell(sock, ws, call, exec_id))
        done, _ = await asyncio.wait(
            {output, keys}, timeout=settings.RELAY_TERMINAL_MAX_S, return_when=asyncio.FIRST_COMPLETED
        )
        for task in (output, keys):
            task.cancel()
        await asyncio.gather(output, keys, return_exceptions=True)
    finally:
        sock.close()  # the shell reads EOF and exits
        stream.close()
    if not ws.closed:  # the shell ended, or its time is up (the web tier closes the socket otherwise)
        exit_code = await call.run(_exit_code, call.api, exec_id) if output in done else None
        if exit_code is not None:
            await ws.send_str(json.dumps({"exit_code": exit_code}))
        reason = "the shell ended (exit, or the instance stopped)" if done else "the session's time is up"
        await ws.close(code=SHELL_ENDED, message=reason.encode())
    return ws


async def _shell_to_socket(sock, ws: web.WebSocketResponse) -> None:
    loop = asyncio.get_running_loop()
    try:
        while data := await loop.sock_recv(sock, READ_BYTES):
            await ws.send_bytes(data)
    except (OSError, ConnectionError):
        pass


async def _socket_to_shell(sock, ws: web.WebSocketResponse, call: Call, exec_id: str) -> None:
    loop = asyncio.get_running_loop()
    async for frame in ws:
        if frame.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
            continue
        try:
            message = json.loads(frame.data)
        except ValueError:
            continue
        if not isinstance(message, dict):
            continue
        if message.get("type") == "input" and isinstance(message.get("data"), str):
            try:
                await loop.sock_sendall(sock, message["data"].encode())
            except OSError:  # the shell is gone: its output side ends the session
                return
        elif message.get("type") == "resize":
            cols, rows = _size(message.get("cols")), _size(message.get("rows"))
            if cols and rows:
                await call.run(call.api.exec_resize, exec_id, height=rows, width=cols)


def _exec_shell(api, container: str):
    exec_id = api.exec_create(
        container, SHELL, stdin=True, tty=True, environment={"TERM": "xterm-256color"}, workdir=_workdir(api, container)
    )["Id"]
    stream = api.exec_start(exec_id, tty=True, socket=True)  # kept: it owns the connection
    raw = stream._sock
    raw.setblocking(False)
    return exec_id, stream, raw


def _workdir(api, container: str) -> str:
    """Where the shell starts: /root, or for a job where its command runs (its code, when it came with some)."""
    config = api.inspect_container(container)["Config"]
    if (config.get("Labels") or {}).get(f"{LABEL}.kind") == WorkloadKind.JOB and config.get("WorkingDir"):
        return config["WorkingDir"]
    return HOME


def _exit_code(api, exec_id: str) -> int | None:
    """The shell's exit status once Docker has it (it notes the end a moment after the output closes)."""
    for _ in range(EXIT_POLLS):
        state = api.exec_inspect(exec_id)
        if not state.get("Running") and state.get("ExitCode") is not None:
            return int(state["ExitCode"])
        time.sleep(EXIT_POLL_S)
    return None


def _size(value) -> int | None:
    return value if isinstance(value, int) and 1 <= value <= 1000 else None
