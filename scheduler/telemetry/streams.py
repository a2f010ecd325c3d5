"""The recent history of live GPU stats: a bounded Redis stream per node and per workload.

A node agent publishes each sample document (``documents.py``) to the
channel-layer group of its node and of each workload on it (``core.messages``
names them), and appends it here, to a stream per node and per workload holding the last
``TELEMETRY_HISTORY_S`` seconds, so that a page that opens or reconnects draws
its chart at once. The streams expire when nothing is written to them (a
released instance's history goes by itself).

A socket that opens gets a compact backfill, not the whole window (15 minutes of an
8-card node's documents are ~3.6 MB): beside each stream, a second one holds one
point per ``backfill_step_s()`` (``TELEMETRY_BACKFILL_POINTS`` over the window), each
the first sample of its step cut to what the charts draw (``documents.charted``); the
backfill is those points and the newest sample whole.
"""

from __future__ import annotations

import json

from django.conf import settings

from core.clients import redis_client


def node_stream(node_name: str) -> str:
    return f"gpucloud:{settings.DEPLOYMENT_ID}:monitor:node:{node_name}"


def workload_stream(node_name: str, workload_id: int) -> str:
    """A workload's history as host ``node_name`` sampled it (named by host, as its group: ``core.redis_acl``)."""
    return f"gpucloud:{settings.DEPLOYMENT_ID}:monitor:workload:{node_name}:{workload_id}"


def backfill_stream(key: str) -> str:
    return f"{key}:backfill"


def history_length() -> int:
    return max(int(settings.TELEMETRY_HISTORY_S / settings.TELEMETRY_INTERVAL_S), 1)


def backfill_step_s() -> float:
    return max(settings.TELEMETRY_HISTORY_S / settings.TELEMETRY_BACKFILL_POINTS, settings.TELEMETRY_INTERVAL_S)


def backfill_due(t: float) -> bool:
    """Whether the sample taken at ``t`` is the first of its backfill step (the one kept as a point)."""
    step = backfill_step_s()
    return t // step != (t - settings.TELEMETRY_INTERVAL_S) // step


def history_append(entries: list[tuple[str, str, str | None]]) -> None:
    """Append (stream key, JSON document, its backfill point or None), trimming each stream to the window."""
    pipe = redis_client().pipeline(transaction=False)
    ttl = int(settings.TELEMETRY_HISTORY_S) + 60
    for key, text, point in entries:
        pipe.xadd(key, {"d": text}, maxlen=history_length(), approximate=True)
        pipe.expire(key, ttl)
        if point is not None:  # trimmed exactly: a reader gets at most TELEMETRY_BACKFILL_POINTS of them
            pipe.xadd(backfill_stream(key), {"d": point}, maxlen=settings.TELEMETRY_BACKFILL_POINTS, approximate=False)
            pipe.expire(backfill_stream(key), ttl)
    pipe.execute()


def backfill_read(key: str) -> list[str]:
    """What a socket that opens gets first: the stream's backfill points, then its newest sample whole."""
    pipe = redis_client().pipeline(transaction=False)
    pipe.xrange(backfill_stream(key))
    pipe.xrevrange(key, count=1)
    points, newest = pipe.execute()
    texts = [fields[b"d"].decode() for _, fields in points]
    if newest:
        last = newest[0][1][b"d"].decode()
        if texts and _stamp(texts[-1]) == _stamp(last):  # that point is the newest sample: sent whole instead
            texts.pop()
        texts.append(last)
    return texts


def _stamp(text: str) -> str:
    """A document's ``"t":...`` (documents begin ``{"v":1,"t":...,``; a point keeps its sample's)."""
    return text.split(",", 2)[1]


def history_read(key: str, *, since_s: float | None = None, count: int | None = None) -> list[str]:
    """JSON documents of one stream, oldest first; the last ``count`` only, when given."""
    client = redis_client()
    if count is not None:
        entries = list(reversed(client.xrevrange(key, count=count)))
    else:
        start = "-" if since_s is None else str(int(since_s * 1000))
        entries = client.xrange(key, min=start)
    return [fields[b"d"].decode() for _, fields in entries]


def latest_node_documents(node_names: list[str]) -> dict[str, dict]:
    """The newest sample of each node that has one."""
    pipe = redis_client().pipeline(transaction=False)
    for name in node_names:
        pipe.xrevrange(node_stream(name), count=1)
    latest = {}
    for name, entries in zip(node_names, pipe.execute(), strict=True):
        if entries:
            latest[name] = json.loads(entries[0][1][b"d"])
    return latest
