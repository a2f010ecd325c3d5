"""Channel-layer fan-out: RedisChannelLayer against RedisPubSubChannelLayer, on the local Redis.

What it measures: the channel layer alone, inside one process and one event loop —
what ``group_send`` costs the publisher and how long until N channels of one
process have the message (``layer.receive``), for a group of N members and for many
small groups (one viewer per instance, the common case). It chose ``CHANNEL_LAYER``
(settings.py) and is kept for that choice.

What it does not measure: what a browser gets. No WebSocket server, no TCP, no
consumer, no authorization, and no viewer in another process — and since the
monitor sockets fan a sample out inside the server process (``portal/sockets/fanout.py``),
a process holds one member per group whatever its viewers. ``bench/ws_viewers.py``
measures the real path (1,000 viewers over TCP through daphne, against a bare
``websockets`` server): quote that for viewers, this for the layer.

    python bench/ws_fanout.py [--viewers 1,10,100,500] [--messages 50]

Uses Redis database 13. Ends with one JSON line per layer and shape:
{"layer", "viewers", "groups", "send_ms_per_message", "delivery_p50_ms", "delivery_p99_ms"}.
"""

import argparse
import asyncio
import json
import os
import statistics
import time

import _setup  # noqa: F401  (puts the project on sys.path)

LAYERS = {"redis": "channels_redis.core.RedisChannelLayer", "pubsub": "channels_redis.pubsub.RedisPubSubChannelLayer"}
REDIS = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")


def make_layer(kind: str):
    from channels_redis.core import RedisChannelLayer
    from channels_redis.pubsub import RedisPubSubChannelLayer

    cls = {"redis": RedisChannelLayer, "pubsub": RedisPubSubChannelLayer}[kind]
    return cls(hosts=[REDIS], prefix=f"bench-{kind}")


async def run(kind: str, viewers: int, groups: int, messages: int) -> dict:
    """``groups`` groups of ``viewers // groups`` members each; ``messages`` samples to every group."""
    layer = make_layer(kind)
    per_group = max(viewers // groups, 1)
    members = {}
    for g in range(groups):
        for _ in range(per_group):
            channel = await layer.new_channel()
            await layer.group_add(f"monitor.bench.{g}", channel)
            members[channel] = g
    delays: list[float] = []
    done = asyncio.Event()
    expected = len(members) * messages

    async def receive(channel):
        for _ in range(messages):
            message = await layer.receive(channel)
            delays.append(time.perf_counter() - message["sent"])
            if len(delays) == expected:
                done.set()

    receivers = [asyncio.create_task(receive(c)) for c in members]
    await asyncio.sleep(0.5)  # let every receiver subscribe before the first message
    payload = "x" * 900  # about one node document with a few cards
    send_s = 0.0
    for _ in range(messages):
        start = time.perf_counter()
        for g in range(groups):  # one after the other, as the node agent's sampler sends them
            await layer.group_send(f"monitor.bench.{g}", {"type": "t", "doc": payload, "sent": start})
        send_s += time.perf_counter() - start
        await asyncio.sleep(0.02)
    await asyncio.wait_for(done.wait(), 120)
    for task in receivers:
        task.cancel()
    delays.sort()
    result = {
        "layer": kind,
        "viewers": len(members),
        "groups": groups,
        "send_ms_per_message": round(send_s / messages * 1000, 2),
        "delivery_p50_ms": round(statistics.median(delays) * 1000, 2),
        "delivery_p99_ms": round(delays[int(len(delays) * 0.99) - 1] * 1000, 2),
    }
    await layer.flush()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--viewers", default="1,10,100,500")
    parser.add_argument("--messages", type=int, default=50)
    args = _setup.parse(parser, viewers="1,10", messages=5)
    results = []
    for viewers in (int(v) for v in args.viewers.split(",")):
        for kind in LAYERS:
            results.append(asyncio.run(run(kind, viewers, 1, args.messages)))
            print(json.dumps(results[-1]), flush=True)
    for kind in LAYERS:  # one viewer per instance: 100 instance groups
        results.append(asyncio.run(run(kind, 100, 100, args.messages)))
        print(json.dumps(results[-1]), flush=True)
    _setup.report({"runs": len(results)}, errors=0)


if __name__ == "__main__":
    main()
