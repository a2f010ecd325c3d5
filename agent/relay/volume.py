"""The relay's data disk: a tar of a stopped instance's data disk, for another host's agent that moves it there.

Docker's archive of the data disk's mount point (``INSTANCE_DATA_PATH``) in the
stopped container is streamed as it comes, hashed on the way; once it has all
gone out, the relay tells the control plane how many bytes it sent and their
SHA-256 (``ToScheduler.MOVE_REPORT``), which holds them against what the
receiving agent counted before the source's copy may go.
"""

from __future__ import annotations

import hashlib

from aiohttp import web
from django.conf import settings

from agent.relay.guard import Call, start
from agent.relay.streams import CHUNK, ThreadChunks
from core.messages import ToScheduler, send


async def volume(request: web.Request, call: Call) -> web.StreamResponse:
    ticket = call.ticket
    chunks = ThreadChunks()
    call.run(chunks.produce, _archive(call.api, ticket.container))
    digest, sent = hashlib.sha256(), 0
    try:
        response = await start(request, web.StreamResponse(headers={"Content-Type": "application/x-tar"}))
        async for chunk in chunks:
            digest.update(chunk)
            sent += len(chunk)
            await response.write(chunk)
        await response.write_eof()
    finally:
        chunks.close()
    await call.run(send, ToScheduler.MOVE_REPORT, ticket.move, {"sent_sha256": digest.hexdigest(), "bytes_sent": sent})
    return response


def _archive(api, container: str):
    stream, _ = api.get_archive(container, settings.INSTANCE_DATA_PATH, chunk_size=CHUNK)
    try:
        yield from stream
    finally:
        stream.close()
