"""What browser viewers of the live monitor get: N WebSocket clients over TCP, against a bare broadcast server.

The real path: the WebSocket server as ``make run`` and docker-compose start it
(``config/websocket_server.py``: daphne processes on one port serving ``config.asgi``;
``--servers`` sets how many); each viewer signs in with a session cookie of its own (a
staff account: the node monitor is staff-only) and opens ``/ws/monitor/nodes/<node>/``,
so every handshake goes through the session, the Origin check and the consumer's
authorization; the documents come from a publisher process running the node agent's
sampler (``agent/telemetry/sampler.py``) at its rate (``TELEMETRY_INTERVAL_S``,
1 Hz) on a simulated 8-card node with 16 tenants (a ~4 KB node document), through
the Redis history and the channel layer (``CHANNEL_LAYER``, pub/sub by default).

The anchor, in the same run: a bare ``websockets`` server that the publisher hands
each node document to, as it publishes it, and that broadcasts those same bytes to
the same clients (each viewer holds one socket to each). Latency is measured at the
client, on receipt, from the sample's own timestamp (the document's ``"t"``), for
both, over the samples taken in the measured window once every viewer is connected.
The clients are ``--processes`` separate processes of asyncio clients; on a small
machine they compete with the servers for the CPU, and the anchor pays that as the
platform does — which is why the ratio to it is the figure to compare. A handshake
refused or dropped (daphne gives up on one it cannot finish in 5 s, as in a
connect storm) is tried again as the page does (1 s, 2 s, ... later): those count
as ``connect_retries``; a viewer still not connected after 180 s is an error.

    python bench/ws_viewers.py [--viewers 1000] [--processes 10] [--seconds 30] [--servers N]
    python bench/ws_viewers.py --quick          # 50 viewers for 10 s (make bench-smoke)

Uses its own PostgreSQL database (gpucloud_ws_bench, recreated: BENCH_DATABASE_URL)
and Redis database 11 (BENCH_REDIS_URL). Ends with one JSON line:
{"viewers", "p50_ms", "p99_ms", "delivered_pct", "anchor_p50_ms", "anchor_p99_ms", "anchor_delivered_pct",
"ratio_vs_anchor", "backfill_bytes", "samples", "servers", "server_cpu_pct", "anchor_cpu_pct",
"connect_retries", "errors", "commit"}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time

import _setup

from tests.ports import free_port

DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpucloud_ws_bench")
os.environ.setdefault("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
NODE = "bench-ws"
CARDS, TENANTS = "sim:8xA100-80GB", 16
ORIGIN = "http://127.0.0.1"
CONNECT_S = 180  # a viewer that has not connected by then (retrying as the page does) is an error


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def answered(url: str) -> None:
    """Wait until the server at ``url`` completes a handshake (it refuses the anonymous: that is an answer)."""
    from websockets.sync.client import connect

    for _ in range(240):
        try:
            with connect(url, open_timeout=5, additional_headers={"Origin": ORIGIN}):
                return
        except (OSError, TimeoutError):
            time.sleep(0.25)
    raise SystemExit(f"no WebSocket server answered at {url}")


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


# --- setup (the orchestrating process) -------------------------------------------------------------


def setup(viewers: int) -> list[str]:
    """A fresh database with the node, its tenants and ``viewers`` staff accounts; their session cookies."""
    _setup.fresh_database(DATABASE_URL)
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.utils import timezone

    from agent.gpus import simulated_inventory
    from scheduler.models import Workload, WorkloadStatus
    from scheduler.services.allocation import Share, allocation_create
    from scheduler.services.nodes import node_register

    node = node_register(
        name=NODE, hostname="bench", cpu_cores=64, memory_mb=1 << 18,
        gpus=simulated_inventory(CARDS, NODE), simulated=True, nvidia_runtime=False,
    )  # fmt: skip
    cards = list(node.gpus.order_by("index"))
    from core.clients import redis_client
    from scheduler.telemetry import streams

    stale = streams.node_stream(NODE)  # an earlier run's history: this run's viewers start from this run's samples
    redis_client().delete(stale, streams.backfill_stream(stale))
    User = get_user_model()
    owner = User.objects.create_user("bench-owner")
    for i in range(TENANTS):  # running work with no container: the node document lists its holders
        card = cards[i % len(cards)]
        w = Workload.objects.create(
            owner=owner, kind="instance", name=f"w{i}", image_ref="bench", gpu_model=card.model, gpu_count=1,
            gpu_milli=500, cpu_cores=1, memory_mb=1024, disk_gb=10,
        )  # fmt: skip
        allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 500, card.memory_mb // 2)])
        Workload.objects.filter(pk=w.pk).update(status=WorkloadStatus.RUNNING, started_at=timezone.now())
    staff = User.objects.bulk_create([User(username=f"viewer-{i}", is_staff=True) for i in range(viewers)])
    store = import_module(settings.SESSION_ENGINE).SessionStore
    cookies = []
    for user in staff:  # a session of each viewer's own, as a browser that signed in holds
        session = store()
        session[SESSION_KEY] = str(user.pk)
        session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
        session[HASH_SESSION_KEY] = user.get_session_auth_hash()
        session.create()
        cookies.append(f"{settings.SESSION_COOKIE_NAME}={session.session_key}")
    return cookies


# --- the publisher: the node agent's sampler, also handing each node document to the anchor ---------


def publisher(anchor_url: str) -> None:
    import django

    django.setup()
    from django.conf import settings
    from websockets.sync.client import connect

    from agent.telemetry.sampler import Sampler
    from agent.telemetry.simgpu import SimulatedBackend
    from scheduler.models import Node

    with connect(anchor_url + "/publish") as anchor:

        class Publisher(Sampler):
            async def _publish(self, outgoing):
                await super()._publish(outgoing)
                anchor.send(outgoing[0][1])  # the node document's bytes, as the channel layer got them

        sampler = Publisher(Node.objects.get(name=NODE), backend=SimulatedBackend(), docker_client=None)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        published, errors, interval = [], 0, settings.TELEMETRY_INTERVAL_S
        next_at = time.monotonic()
        while not stop.is_set():  # the sampler's own schedule (run_forever), counting what it published
            try:
                published.append(sampler.sample_once()["t"])
            except Exception as exc:
                errors += 1
                print(f"sample failed: {exc!r}", file=sys.stderr)
            next_at += interval
            stop.wait(max(next_at - time.monotonic(), 0))
    print(json.dumps({"published": published, "errors": errors}), flush=True)


# --- the anchor: a bare websockets broadcast server ---------------------------------------------------


def anchor(port: int) -> None:
    from websockets.asyncio.server import broadcast, serve

    viewers = set()

    async def handler(ws):
        if ws.request.path == "/publish":
            async for text in ws:
                broadcast(viewers, text)
            return
        await ws.send('{"type":"history","samples":[]}')
        viewers.add(ws)
        try:
            await ws.wait_closed()
        finally:
            viewers.discard(ws)

    async def main():
        async with serve(handler, "127.0.0.1", port, max_queue=None, compression=None) as server:
            await server.serve_forever()

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    asyncio.run(main())


# --- the clients ---------------------------------------------------------------------------------------


def sample_time(text: str) -> float | None:
    """The "t" of a sample document (the sampler writes ``{"v":1,"t":...,``), without parsing 4 KB of JSON."""
    start = text.find('"t":', 0, 40)
    if start < 0:
        return None
    return float(text[start + 4 : text.index(",", start)])


def clients(cookies: list[str], platform_url: str, anchor_url: str) -> None:
    """Each viewer: one socket to the platform, one to the anchor; every live sample's (t, latency)."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidHandshake

    results = [{"platform": [], "anchor": [], "backfill": 0, "errors": [], "retries": []} for _ in cookies]
    gate = asyncio.Semaphore(4)  # handshakes at once from this process
    stop = asyncio.Event()

    async def opened(url: str, headers: dict, mine: dict):
        """Connect as the monitor page does: a refused or dropped handshake is tried again, 1 s later, then 2 s..."""
        delay, deadline = 1, time.monotonic() + CONNECT_S
        while True:
            try:
                async with gate:
                    return await connect(
                        url, additional_headers=headers, max_size=None, compression=None, open_timeout=30
                    )
            except (OSError, TimeoutError, InvalidHandshake) as exc:
                if time.monotonic() + delay > deadline:
                    raise
                mine["retries"].append(f"{exc!r}"[:120])
                await asyncio.sleep(delay)
                delay = min(delay * 2, 8)

    async def watch(k: int, url: str, side: str, headers: dict, ready: asyncio.Event):
        mine = results[k]
        try:
            ws = await opened(url, headers, mine)
            async with ws:
                first = await asyncio.wait_for(ws.recv(), 60)
                if not first.startswith('{"type":"history"'):
                    mine["errors"].append(f"{side}: the first message is not the backfill")
                elif side == "platform":
                    mine["backfill"] = len(first)
                ready.set()
                got = mine[side]
                receiving = asyncio.ensure_future(ws.recv())
                stopping = asyncio.ensure_future(stop.wait())
                while True:
                    await asyncio.wait({receiving, stopping}, return_when=asyncio.FIRST_COMPLETED)
                    if stopping.done():
                        receiving.cancel()
                        return
                    text = receiving.result()
                    t = sample_time(text)
                    got.append((t, round((time.time() - t) * 1000, 2)))
                    receiving = asyncio.ensure_future(ws.recv())
        except Exception as exc:
            mine["errors"].append(f"{side}: {exc!r}"[:200])
            ready.set()

    async def main():
        loop = asyncio.get_running_loop()
        readies = [asyncio.Event() for _ in range(2 * len(cookies))]
        tasks = []
        for k, cookie in enumerate(cookies):
            headers = {"Origin": ORIGIN, "Cookie": cookie}
            tasks.append(asyncio.create_task(watch(k, platform_url, "platform", headers, readies[2 * k])))
            tasks.append(asyncio.create_task(watch(k, anchor_url, "anchor", {}, readies[2 * k + 1])))
        await asyncio.gather(*(r.wait() for r in readies))
        print("ready", flush=True)
        await loop.run_in_executor(None, sys.stdin.read)  # the orchestrator closes our stdin: stop
        stop.set()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    print(json.dumps(results), flush=True)


# --- the orchestrator ------------------------------------------------------------------------------------


def spawn(args: list[str], env: dict, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], env=env, cwd=str(_setup.ROOT), **kwargs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--viewers", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=10, help="client processes")
    parser.add_argument("--seconds", type=float, default=30, help="measured window")
    parser.add_argument("--servers", type=int, default=None, help="daphne processes (default: as production runs)")
    parser.add_argument("--quick", action="store_true", help="50 viewers in 2 processes for 10 s")
    parser.add_argument("--role", choices=["publisher", "anchor", "clients"], help=argparse.SUPPRESS)
    parser.add_argument("--url", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "publisher":
        return publisher(args.url[0])
    if args.role == "anchor":
        return anchor(int(args.url[0]))
    if args.role == "clients":
        return clients(json.loads(sys.stdin.readline()), args.url[0], args.url[1])
    if args.quick:
        args.viewers, args.processes, args.seconds = 50, 2, 10
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a server holds a socket per viewer

    cookies = setup(args.viewers)
    env = {**os.environ, "PYTHONPATH": str(_setup.ROOT)}
    ws_port, anchor_port = free_port(), free_port()
    logs = _setup.ROOT / "var" / "log"
    logs.mkdir(parents=True, exist_ok=True)
    server_log = open(logs / "bench-ws-viewers-daphne.log", "w")  # noqa: SIM115  (kept for the processes)
    server = spawn(
        ["-m", "config.websocket_server", *(["--processes", str(args.servers)] if args.servers else []),
         "-b", "127.0.0.1", "-p", str(ws_port), "config.asgi:application"], env, stdout=server_log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    script = str(_setup.ROOT / "bench" / "ws_viewers.py")
    anchor_server = spawn([script, "--role", "anchor", "--url", str(anchor_port)], env)
    errors: list[str] = []
    processes, publishing = [], None
    try:
        for _ in range(120):
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", anchor_port)) == 0:
                    break
            time.sleep(0.25)
        answered(f"ws://127.0.0.1:{ws_port}/ws/monitor/nodes/{NODE}/")  # daphne has loaded Django
        time.sleep(2)  # and so have the others
        publishing = spawn(
            [script, "--role", "publisher", "--url", f"ws://127.0.0.1:{anchor_port}"], env, stdout=subprocess.PIPE
        )
        platform_url = f"ws://127.0.0.1:{ws_port}/ws/monitor/nodes/{NODE}/"
        anchor_url = f"ws://127.0.0.1:{anchor_port}/viewer"
        share = -(-args.viewers // args.processes)
        for p in range(args.processes):
            mine = cookies[p * share : (p + 1) * share]
            if not mine:
                continue
            proc = spawn([script, "--role", "clients", "--url", platform_url, anchor_url], env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
            proc.stdin.write(json.dumps(mine) + "\n")
            proc.stdin.flush()
            processes.append(proc)
        for proc in processes:
            if proc.stdout.readline().strip() != "ready":
                errors.append(f"client process {proc.pid} did not get ready")
        time.sleep(2)  # past the connect storm
        start = time.time()
        servers = [*children(server.pid), anchor_server.pid]
        cpu_before = [cpu_seconds(pid) for pid in servers]
        time.sleep(args.seconds)
        end = time.time()
        cpu_after = [cpu_seconds(pid) for pid in servers]
        time.sleep(3)  # the window's last samples arrive
        results = []
        for proc in processes:
            proc.stdin.close()
        for proc in processes:
            line = proc.stdout.readline()
            results.extend(json.loads(line) if line else [])
            if proc.wait(60) != 0 or not line:
                errors.append(f"client process {proc.pid} exited {proc.returncode}")
        publishing.send_signal(signal.SIGTERM)
        published = json.loads(publishing.communicate(timeout=30)[0])
    finally:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(20)
        for proc in [*processes, server, anchor_server, *([publishing] if publishing else [])]:
            if proc.poll() is None:
                proc.kill()
    window = {t for t in published["published"] if start <= t <= end}
    errors += [e for r in results for e in r["errors"]] + ["publisher"] * published["errors"]
    errors += ["viewer lost"] * (args.viewers - len(results))

    def side(name: str) -> tuple[list[float], float]:
        delays, delivered = [], 0
        for r in results:
            seen = {t: ms for t, ms in r[name] if t in window}
            delays.extend(seen.values())
            delivered += len(seen)
        return delays, 100 * delivered / max(args.viewers * len(window), 1)

    delays, delivered_pct = side("platform")
    anchor_delays, anchor_pct = side("anchor")
    p99, anchor_p99 = percentile(delays, 0.99), percentile(anchor_delays, 0.99)
    window_s = end - start
    server_cpu = sum(a - b for a, b in zip(cpu_after[:-1], cpu_before[:-1], strict=True)) / window_s * 100
    retries = [x for r in results for x in r["retries"]]
    for error in sorted(set(errors))[:10]:
        print(f"error: {error} (x{errors.count(error)})", file=sys.stderr)
    for retry in sorted(set(retries))[:5]:
        print(f"handshake tried again after: {retry} (x{retries.count(retry)})", file=sys.stderr)
    print(json.dumps({
        "viewers": args.viewers,
        "p50_ms": round(percentile(delays, 0.5), 1),
        "p99_ms": round(p99, 1),
        "delivered_pct": round(delivered_pct, 3),
        "anchor_p50_ms": round(percentile(anchor_delays, 0.5), 1),
        "anchor_p99_ms": round(anchor_p99, 1),
        "anchor_delivered_pct": round(anchor_pct, 3),
        "ratio_vs_anchor": round(p99 / anchor_p99, 2) if anchor_p99 else None,
        "backfill_bytes": max((r["backfill"] for r in results), default=0),
        "samples": len(window),
        "servers": len(servers) - 1,
        "server_cpu_pct": round(server_cpu, 1),
        "anchor_cpu_pct": round((cpu_after[-1] - cpu_before[-1]) / window_s * 100, 1),
        "connect_retries": len(retries),
        "errors": len(errors),
        "commit": _setup.commit(),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
