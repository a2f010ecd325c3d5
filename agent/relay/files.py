"""The relay's files: list a folder, download a file, upload one — streamed, bounded in size and time.

Every path is the ticket's, resolved below the ticket's root (``paths.resolve``:
links that leave it are refused). A listing runs one ``find ... -exec stat``
in the container and streams one JSON entry a line, at most LIST_MAX_ENTRIES;
links are listed as links. That ``sh`` and ``find`` are the tenant's own, so their
output is read as a stranger's: at most LIST_LINE_MAX_BYTES a line and LIST_MAX_BYTES
in all, or the listing ends with ``{"error": ...}``; and when a listing ends for any
reason (done, its cap, its time limit, the client gone) its process is killed if it
still runs (``exec_kill``): ending the HTTP side alone would leave it, and the
relay thread reading it, running. A download streams Docker's archive of the file,
unpacked on the fly, with its length up front; an upload streams the request
body into Docker's archive API inside a tar made on the fly. Transfers are
limited to FILE_TRANSFER_MAX_MB (the server puts the time limits on every handler).

A job that has ended has no container left, but its disk (``JOB_CHECKPOINT_PATH``)
stays on its host until it is released: a listing or a download of it runs in a
helper (``ended_helper``), a container of the job's image given that disk read-only,
with no network, no capabilities, a few processes and little memory, removed when
the call ends (and by Docker itself soon after, should the agent stop first).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import posixpath
import signal
import threading
import time
from collections.abc import Iterator

import docker
from aiohttp import web
from django.conf import settings

from agent.labels import LABEL
from agent.relay.guard import Call, EndedJob, Refused, start
from agent.relay.paths import resolve
from agent.relay.streams import CHUNK, ThreadChunks, file_from_tar, loop_chunks, tar_of_one_file
from core.errors import InvalidInput
from core.relay import within

log = logging.getLogger(__name__)
LIST_MAX_ENTRIES = 5000
LIST_LINE_MAX_BYTES = 8192  # an entry is "<kind>|<size>|./<name>", a name at most 255 bytes
LIST_MAX_BYTES = 8 * 1024 * 1024  # LIST_MAX_ENTRIES entries are at most about 1.5 MB
IDLE_S = 60  # the longest wait for the next chunk of an upload
LIST_SCRIPT = 'cd -- "$1" && exec find . -mindepth 1 -maxdepth 1 -exec stat -c "%F|%s|%n" -- {} +'
EXEC_PID_WAIT_S = 5
KINDS = {"directory": "dir", "symbolic link": "link", "regular file": "file", "regular empty file": "file"}


def _max_bytes() -> int:
    return settings.FILE_TRANSFER_MAX_MB * 1024 * 1024


def _in_the_container_read(handler):
    """``handler(request, call, container)`` as a relay handler: the container the call reads (``_reading``)."""

    @functools.wraps(handler)
    async def serve(request: web.Request, call: Call) -> web.StreamResponse:
        async with _reading(call) as container:
            return await handler(request, call, container)

    return serve


@_in_the_container_read
async def listing(request: web.Request, call: Call, container: str) -> web.StreamResponse:
    ticket = call.ticket
    folder = await call.run(resolve, call.api, container, ticket.path, ticket.root)
    if not folder.is_dir:
        raise InvalidInput(f"{ticket.path} is not a folder", field="path")
    lines, find = ThreadChunks(), _Find(call.api, container, folder.path)
    call.run(lines.produce, find.lines())
    try:
        response = await start(request, web.StreamResponse(headers={"Content-Type": "application/x-ndjson"}))
        count, last = 0, {"end": True}
        try:
            async for line in lines:
                kind, _, rest = line.partition("|")
                size, _, name = rest.partition("|")
                name = name.removeprefix("./")
                if not name:
                    continue
                if count == LIST_MAX_ENTRIES:
                    last = {"truncated": True}
                    break
                entry = {"name": name, "kind": KINDS.get(kind, "other"), "size": int(size) if size.isdigit() else None}
                await response.write(json.dumps(entry).encode() + b"\n")
                count += 1
        except InvalidInput as exc:
            last = {"error": exc.message}
        await response.write(json.dumps(last).encode() + b"\n")  # a listing without it was cut short
    finally:
        lines.close()
        find.stop()
    return response


@contextlib.asynccontextmanager
async def _reading(call: Call):
    """The container a file call reads: the ticket's, or for an ended job a helper with its disk, removed after."""
    if call.ended is None:
        yield call.ticket.container
        return
    if not within(call.ticket.path, settings.JOB_CHECKPOINT_PATH):
        raise InvalidInput(
            f"once a job has ended only its disk, {settings.JOB_CHECKPOINT_PATH}, is left on its host", field="path"
        )
    helper = await call.run(ended_helper, call.api, call.ended)
    try:
        yield helper
    finally:
        with contextlib.suppress(Refused):  # the user's relay threads are all busy: it ends by itself
            await call.run(helper_remove, call.api, helper)  # gone before the call ends: a release may follow


def ended_helper(api, ended: EndedJob) -> str:
    """A running container of the ended job's image with its disk read-only where it was (its id)."""
    host_config = api.create_host_config(
        binds={ended.volume: {"bind": settings.JOB_CHECKPOINT_PATH, "mode": "ro"}},
        network_mode="none",
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        pids_limit=32,
        mem_limit="64m",
        nano_cpus=250_000_000,
        auto_remove=True,  # gone by itself once its sleep ends, should the agent stop before it removes it
    )
    try:
        created = api.create_container(
            ended.image,
            entrypoint=["sleep", str(settings.RELAY_TRANSFER_TIMEOUT_S + 60)],  # past any call's limit
            host_config=host_config,
            labels={f"{LABEL}.files-helper": ended.volume},
        )
    except docker.errors.ImageNotFound:
        raise Refused(409, f"the job's image {ended.image} is no longer on its host to read its disk with") from None
    try:
        api.start(created["Id"])
    except docker.errors.APIError as exc:  # an image without sleep, say
        helper_remove(api, created["Id"])
        raise Refused(
            409, f"the job's image {ended.image} cannot run a helper to read its disk: {exc.explanation}"
        ) from None
    return created["Id"]


def helper_remove(api, helper: str) -> None:
    try:
        api.remove_container(helper, force=True)
    except docker.errors.APIError as exc:  # removed already (auto_remove), or being removed
        log.debug("files helper %s: %s", helper, exc)


class _Find:
    """The listing's ``find`` in the container: ``lines()`` on a worker thread, ``stop()`` from anywhere."""

    def __init__(self, api, container: str, folder: str):
        self.api, self.container, self.folder = api, container, folder
        self._stream = None
        self._stopped = threading.Event()

    def lines(self) -> Iterator[str]:
        """Its output's lines, each at most LIST_LINE_MAX_BYTES, all at most LIST_MAX_BYTES (else InvalidInput);
        read in linear time (a line is gathered in pieces, joined once); its process is killed at the end."""
        command = ["sh", "-c", LIST_SCRIPT, "sh", self.folder]
        exec_id = self.api.exec_create(self.container, command, stdout=True, stderr=False)["Id"]
        try:
            self._stream = self.api.exec_start(exec_id, stream=True)
            if self._stopped.is_set():  # stopped while it started
                return
            pieces, held, total = [], 0, 0
            for chunk in self._stream:
                total += len(chunk)
                if total > LIST_MAX_BYTES:
                    raise InvalidInput(f"the listing is longer than {LIST_MAX_BYTES} bytes", field="path")
                begin = 0
                while (end := chunk.find(b"\n", begin)) >= 0 and held + end - begin <= LIST_LINE_MAX_BYTES:
                    pieces.append(chunk[begin:end])
                    yield b"".join(pieces).decode(errors="replace")
                    pieces, held, begin = [], 0, end + 1
                held += len(chunk) - begin
                if held > LIST_LINE_MAX_BYTES:
                    raise InvalidInput(f"the listing has a line longer than {LIST_LINE_MAX_BYTES} bytes", field="path")
                pieces.append(chunk[begin:])
        finally:
            try:
                exec_kill(self.api, exec_id)
            finally:
                self.stop()

    def stop(self) -> None:
        """End the read: its socket is shut, so a thread waiting on it returns at once (not a blocking call)."""
        self._stopped.set()
        if self._stream is not None:
            try:
                self._stream.close()
            except OSError:  # closed already
                pass


def exec_kill(api, exec_id: str) -> None:
    """SIGKILL the process of a ``docker exec`` if it still runs (Docker has no call for it).

    Docker reports the process's pid on the host, whose process table the agent shares. It is signalled
    through a pidfd, and only if it is in the exec's container's cgroup: a pid reused meanwhile is never hit.
    What the process started lives on in the container (the tenant's own, counted against his own limits).
    Docker says an exec runs before it says its pid (measured: Running true, Pid 0, for an exec that had
    already written 8 MB): the pid is asked for again, for up to EXEC_PID_WAIT_S.
    """
    deadline = time.monotonic() + EXEC_PID_WAIT_S
    while True:
        try:
            state = api.exec_inspect(exec_id)
        except docker.errors.APIError as exc:  # its container is gone, and the process with it
            log.warning("exec %s: not inspected, not killed: %s", exec_id, exc)
            return
        if not (state.get("Running") and not state.get("Pid") and time.monotonic() < deadline):
            break
        time.sleep(0.02)
    pid, container = state.get("Pid"), state.get("ContainerID") or ""
    if state.get("Running") and not pid:
        log.warning("exec %s: Docker gave no pid within %s s, not killed", exec_id, EXEC_PID_WAIT_S)
    if not (state.get("Running") and pid and container):
        return
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            if container not in f.read():
                log.warning("exec %s: pid %s is not in container %s's cgroup, not killed", exec_id, pid, container)
                return
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except (ProcessLookupError, FileNotFoundError):  # it ended meanwhile
        pass
    except PermissionError as exc:
        log.warning("exec %s: could not kill pid %s: %s", exec_id, pid, exc)
    finally:
        os.close(pidfd)


@_in_the_container_read
async def download(request: web.Request, call: Call, container: str) -> web.StreamResponse:
    ticket = call.ticket
    found = await call.run(resolve, call.api, container, ticket.path, ticket.root)
    if not found.is_file:
        raise InvalidInput(f"{ticket.path} is not a file (pack folders first)", field="path")
    if found.size > _max_bytes():
        raise InvalidInput(f"download a file of at most {settings.FILE_TRANSFER_MAX_MB} MB", field="path")
    chunks = ThreadChunks()
    call.run(chunks.produce, _file_chunks(call.api, container, found.path))
    try:
        member = await anext(chunks)  # before the answer starts: a refusal is still a 400
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(member.size)}
        response = await start(request, web.StreamResponse(headers=headers))
        async for chunk in chunks:
            await response.write(chunk)
    finally:
        chunks.close()
    return response


def _file_chunks(api, container: str, path: str):
    stream, _ = api.get_archive(container, path, chunk_size=CHUNK)
    try:
        yield from file_from_tar(stream)
    finally:
        stream.close()


async def upload(request: web.Request, call: Call) -> web.Response:
    ticket = call.ticket
    name = ticket.name
    if not name or "/" in name or name in (".", "..") or "\x00" in name:
        raise InvalidInput("a plain file name, without folders", field="file")
    if ticket.size > _max_bytes():
        raise InvalidInput(f"at most {settings.FILE_TRANSFER_MAX_MB} MB per file", field="file")
    folder = await call.run(resolve, call.api, ticket.container, ticket.path, ticket.root, field="dir")
    if not folder.is_dir:
        raise InvalidInput(f"{ticket.path} is not a folder", field="dir")
    body = loop_chunks(asyncio.get_running_loop(), lambda: request.content.read(CHUNK), idle_s=IDLE_S)
    archive = tar_of_one_file(name, ticket.size, body)
    if not await call.run(call.api.put_archive, ticket.container, folder.path, archive):
        raise InvalidInput(f"could not write into {ticket.path}", field="dir")
    return web.json_response({"path": posixpath.join(ticket.path, name)}, status=201)
