"""The relay server: one aiohttp application, on its own thread and event loop inside the node agent.

Each operation of ``core.relay.Op`` is one route ``/v1/<op>`` and one handler
in HANDLERS, with its time limit; a new operation (the CLI's logs) is one more
line there and one more handler (as the logs were). Every request passes ``Guard.admit`` first
(the ticket, then the container's labels), then runs under its time limit.
Errors are shaped as the API shapes them: ``{"detail": ..., "<field>": [...]}``.
Blocking Docker calls run on the relay's own threads, never on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
from aiohttp import web
from django.conf import settings

from agent.relay import files, logs, terminal, volume
from agent.relay.guard import STARTED, THREADS, Call, Guard, Refused, Threads
from agent.relay.tls import relay_tls
from core.errors import ServiceError
from core.relay import Op

log = logging.getLogger(__name__)
Handler = Callable[[web.Request, Call], Awaitable[web.StreamResponse]]
LIST_TIMEOUT_S = 30

# operation -> (HTTP method, handler, time limit in seconds; None: the handler keeps its own)
HANDLERS: dict[Op, tuple[str, Handler, Callable[[], float | None]]] = {
    Op.TERMINAL: ("GET", terminal.terminal, lambda: None),
    Op.LIST: ("GET", files.listing, lambda: LIST_TIMEOUT_S),
    Op.DOWNLOAD: ("GET", files.download, lambda: settings.RELAY_TRANSFER_TIMEOUT_S),
    Op.UPLOAD: ("PUT", files.upload, lambda: settings.RELAY_TRANSFER_TIMEOUT_S),
    Op.VOLUME: ("GET", volume.volume, lambda: settings.MOVE_TRANSFER_TIMEOUT_S),
    Op.LOGS: ("GET", logs.logs, lambda: None),  # a followed log stays open while its run lasts
}


def relay_app(*, node: str, api: docker.APIClient, executor) -> web.Application:
    guard = Guard(node=node, deployment=settings.DEPLOYMENT_ID)
    threads = Threads(executor)
    app = web.Application(middlewares=[_shaped_errors])
    for op, (method, handler, limit) in HANDLERS.items():
        app.router.add_route(method, f"/v1/{op}", _route(guard, op, handler, limit, api, threads))
    return app


def _route(guard: Guard, op: Op, handler: Handler, limit, api, threads: Threads):
    async def serve(request: web.Request) -> web.StreamResponse:
        call = await guard.admit(request, op, api=api, threads=threads)
        try:
            async with asyncio.timeout(limit()):
                return await handler(request, call)
        except Exception as exc:
            started = request.get(STARTED)
            if started is None:
                raise
            # The answer has begun: a failure can only cut it short (the client sees the length fall short).
            log.warning("relay %s for %s cut short: %r", op, call.ticket.container, exc)
            if request.transport is not None:
                request.transport.abort()
            return started

    return serve


@web.middleware
async def _shaped_errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Refused as exc:
        return web.json_response({"detail": exc.message}, status=exc.status)
    except ServiceError as exc:
        body = {"detail": exc.message} | ({exc.field: [exc.message]} if exc.field else {})
        return web.json_response(body, status=exc.status_code)
    except TimeoutError:
        return web.json_response({"detail": "the operation took too long"}, status=504)


class RelayServer:
    """The relay on a daemon thread: ``start()`` binds, serves and returns its URL; ``stop()`` ends it.

    Over TLS with ``RELAY_TLS`` (the default): its own key and certificate (``agent.relay.tls``), whose
    SHA-256 (``tls_sha256``) the agent registers beside the URL for callers to pin."""

    def __init__(self, node: str, *, api: docker.APIClient, host: str | None = None, port: int | None = None):
        self.node, self.api = node, api
        self.host = host if host is not None else settings.RELAY_BIND
        self.port = port if port is not None else settings.RELAY_PORT
        self.url = ""
        self.tls_sha256 = ""  # the certificate's SHA-256, registered with the URL (core.relay_tls); "" without TLS
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._error: BaseException | None = None

    def start(self) -> str:
        sock = socket.create_server((self.host, self.port), reuse_port=False)
        port = sock.getsockname()[1]
        address = settings.NODE_ADDRESS if self.host in ("0.0.0.0", "::", "") else self.host
        context = None
        if settings.RELAY_TLS:
            context, self.tls_sha256 = relay_tls(Path(settings.AGENT_STATE_DIR) / self.node, self.node)
        scheme = "https" if context else "http"
        self.url = f"{scheme}://{f'[{address}]' if ':' in address else address}:{port}"
        self._thread = threading.Thread(target=self._run, args=(sock, context), name="relay", daemon=True)
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"the relay did not start: {self._error}")
        log.info("relay of node %s serving at %s", self.node, self.url)
        return self.url

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(30)

    def _run(self, sock: socket.socket, context: ssl.SSLContext | None) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._serve(sock, context))
        except BaseException as exc:  # noted for start(), which is waiting
            self._error = exc
            self._ready.set()
            log.exception("the relay stopped")
        finally:
            self._loop.close()

    async def _serve(self, sock: socket.socket, context: ssl.SSLContext | None) -> None:
        self._stopping = asyncio.Event()
        with ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="relay") as executor:
            runner = web.AppRunner(relay_app(node=self.node, api=self.api, executor=executor), access_log=None)
            await runner.setup()
            await web.SockSite(runner, sock, ssl_context=context).start()
            self._ready.set()
            try:
                await self._stopping.wait()
            finally:
                await runner.cleanup()
