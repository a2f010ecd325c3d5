"""The recent history of live GPU stats: a bounded Redis stream per node and per workload.

A node agent publishes each sample document (``documents.py``) to the
channel-layer group of its node and of each workload on it (``config.messages``
names them), and appends it here, to a stream per node and per workload holding the last
``TELEMETRY_HISTORY_S`` seconds, so that a page that opens or reconnects draws
its chart at once. The streams expire when nothing is written to them (a
released instance's history goes by itself).
"""

from __future__ import annotations

import json
from functools import cache

import redis
from django.conf import settings


def node_stream(node_name: str) -> str:
    return f"gpucloud:{settings.DEPLOYMENT_ID}:monitor:node:{node_name}"


def workload_stream(workload_id: int) -> str:
    return f"gpucloud:{settings.DEPLOYMENT_ID}:monitor:workload:{workload_id}"


def history_length() -> int:
    return max(int(settings.TELEMETRY_HISTORY_S / settings.TELEMETRY_INTERVAL_S), 1)


@cache
def history_client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5)


def history_append(entries: list[tuple[str, str]]) -> None:
    """Append (stream key, JSON document) pairs, trimming each stream to the history window."""
    pipe = history_client().pipeline(transaction=False)
    for key, text in entries:
        pipe.xadd(key, {"d": text}, maxlen=history_length(), approximate=True)
        pipe.expire(key, int(settings.TELEMETRY_HISTORY_S) + 60)
    pipe.execute()


def history_read(key: str, *, since_s: float | None = None, count: int | None = None) -> list[str]:
    """JSON documents of one stream, oldest first; the last ``count`` only, when given."""
    client = history_client()
    if count is not None:
        entries = list(reversed(client.xrevrange(key, count=count)))
    else:
        start = "-" if since_s is None else str(int(since_s * 1000))
        entries = client.xrange(key, min=start)
    return [fields[b"d"].decode() for _, fields in entries]


def latest_node_documents(node_names: list[str]) -> dict[str, dict]:
    """The newest sample of each node that has one."""
    pipe = history_client().pipeline(transaction=False)
    for name in node_names:
        pipe.xrevrange(node_stream(name), count=1)
    latest = {}
    for name, entries in zip(node_names, pipe.execute(), strict=True):
        if entries:
            latest[name] = json.loads(entries[0][1][b"d"])
    return latest
