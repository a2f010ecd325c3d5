"""The relay's files: list a folder, download a file, upload one — streamed, bounded in size and time.

Every path is the ticket's, resolved below the ticket's root (``paths.resolve``:
links that leave it are refused). A listing runs one ``find ... -exec stat``
in the container and streams one JSON entry a line, at most LIST_MAX_ENTRIES;
links are listed as links. A download streams Docker's archive of the file,
unpacked on the fly, with its length up front; an upload streams the request
body into Docker's archive API inside a tar made on the fly. Transfers are
limited to FILE_TRANSFER_MAX_MB (the server puts the time limits on every handler).
"""

from __future__ import annotations

import asyncio
import json
import posixpath

from aiohttp import web
from django.conf import settings

from scheduler.errors import InvalidInput
from scheduler.node.relay.guard import Call, start
from scheduler.node.relay.paths import resolve
from scheduler.node.relay.streams import CHUNK, ThreadChunks, file_from_tar, loop_chunks, tar_of_one_file

LIST_MAX_ENTRIES = 5000
IDLE_S = 60  # the longest wait for the next chunk of an upload
LIST_SCRIPT = 'cd -- "$1" && exec find . -mindepth 1 -maxdepth 1 -exec stat -c "%F|%s|%n" -- {} +'
KINDS = {"directory": "dir", "symbolic link": "link", "regular file": "file", "regular empty file": "file"}


def _max_bytes() -> int:
    return settings.FILE_TRANSFER_MAX_MB * 1024 * 1024


async def listing(request: web.Request, call: Call) -> web.StreamResponse:
    ticket = call.ticket
    folder = await call.run(resolve, call.api, ticket.container, ticket.path, ticket.root)
    if not folder.is_dir:
        raise InvalidInput(f"{ticket.path} is not a folder", field="path")
    lines = ThreadChunks()
    call.run(lines.produce, _list_lines(call.api, ticket.container, folder.path))
    try:
        response = await start(request, web.StreamResponse(headers={"Content-Type": "application/x-ndjson"}))
        count, last = 0, {"end": True}
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
        await response.write(json.dumps(last).encode() + b"\n")  # a listing without it was cut short
    finally:
        lines.close()
    return response


def _list_lines(api, container: str, folder: str):
    exec_id = api.exec_create(container, ["sh", "-c", LIST_SCRIPT, "sh", folder], stdout=True, stderr=False)["Id"]
    stream = api.exec_start(exec_id, stream=True)
    try:
        pending = b""
        for chunk in stream:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode(errors="replace")
    finally:
        stream.close()


async def download(request: web.Request, call: Call) -> web.StreamResponse:
    ticket = call.ticket
    found = await call.run(resolve, call.api, ticket.container, ticket.path, ticket.root)
    if not found.is_file:
        raise InvalidInput(f"{ticket.path} is not a file (pack folders first)", field="path")
    if found.size > _max_bytes():
        raise InvalidInput(f"download a file of at most {settings.FILE_TRANSFER_MAX_MB} MB", field="path")
    chunks = ThreadChunks()
    call.run(chunks.produce, _file_chunks(call.api, ticket.container, found.path))
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
