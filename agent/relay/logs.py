"""The relay's logs: one run's piece of a workload's log on this host, read, tailed or followed.

The lines are passed on as the collector stored them (already the wire's JSON, one a line); the
answer ends with a ``{"piece": ...}`` line that says whether the run's output has ended here. While
following, the handler waits on the collector's change notices (the agent runs both), and writes
``{}`` every KEEPALIVE_S without news so that a vanished client is noticed. The files are read a page
(``worklogs.READ_BYTES``) at a time, each written before the next is read.
"""

from __future__ import annotations

import json

from aiohttp import web

from agent import worklogs
from agent.relay.guard import Call, Refused, start

KEEPALIVE_S = 15
BATCH = 256 * 1024  # bytes written at once


async def logs(request: web.Request, call: Call) -> web.StreamResponse:
    ticket = call.ticket
    state = await call.run(worklogs.state_read, ticket.workload, ticket.run)
    if state is None:
        raise Refused(404, f"no run {ticket.run} of workload {ticket.workload}'s log on this node")
    reader = worklogs.RunReader(ticket.workload, ticket.run, after=ticket.after, since=ticket.since)
    response = await start(request, web.StreamResponse(headers={"Content-Type": "application/x-ndjson"}))
    if ticket.tail:
        lines = await call.run(worklogs.run_tail, ticket.workload, ticket.run, ticket.tail, since=ticket.since)
        await _write(response, lines)
        reader.after = max(ticket.after, worklogs.seq_of(lines[-1]) if lines else state.seq)
    while True:
        version = worklogs.changed.version(ticket.workload)
        state = await call.run(reader.state)  # before the lines: a finished state's lines are all read below
        await _write(response, await call.run(reader.more))
        while not reader.caught_up:  # a page at a time: the run's files are never all in memory
            await _write(response, await call.run(reader.more))
        if not ticket.follow or state is None or state.finished:
            break
        if await call.run(worklogs.changed.wait, ticket.workload, version, KEEPALIVE_S) == version:
            await response.write(b"{}\n")
    piece = {
        "finished": bool(state and state.finished),
        "exit_code": state.exit_code if state else None,
        "seq": reader.after,
        "kept_bytes": state.kept_bytes if state else 0,
        "dropped_bytes": state.dropped_bytes if state else 0,
    }
    await response.write(json.dumps({"piece": piece}).encode() + b"\n")
    return response


async def _write(response: web.StreamResponse, lines: list[bytes]) -> None:
    batch, size = [], 0
    for line in lines:
        batch.append(line)
        size += len(line)
        if size >= BATCH:
            await response.write(b"".join(batch))
            batch, size = [], 0
    if batch:
        await response.write(b"".join(batch))
