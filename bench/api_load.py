"""Control-plane HTTP speed: the real server on PostgreSQL, served as in production (gunicorn).

An account holds 20 instances. In one run, beside the trivial view served the
same way (/api/v1/me/: the same token authentication, throttles and DRF stack,
a constant answer; /healthz/, with no authentication, is shown too):
(1) closed loop, 1 and 50 clients: capacity (requests/s) of the instance list
    and of the trivial view, measured in turns (list, trivial, trivial, list);
    50 clients: of the mix below;
(2) open loop (Poisson arrivals) at half the mix's capacity, list / detail /
    create / release (70/20/5/5), for --seconds: latency percentiles, measured
    from each request's scheduled time (so queueing counts);
(3) the list alone and the trivial view alone, each at half its own capacity,
    in turns (list, trivial, trivial, list; --seconds in all per kind) after a
    CHECKPOINT: their p99s and the ratio;
(4) both in one open loop, each at a quarter of its own capacity, for --seconds:
    their p99s and the ratio ("together_..."), which a stall of the machine
    cannot tilt towards one kind.

    python bench/api_load.py [--seconds 30] [--closed-seconds 8]

The load generator is a raw asyncio HTTP/1.1 client with keep-alive, on the same
machine (it takes part of a core: the numbers are a floor). Uses its own
PostgreSQL database (gpucloud_bench, recreated) and Redis database 14.
Ends with {"rps", "ratio_vs_trivial", "scaling_1_to_50", "p50_ms", "p99_ms", "list_p99_vs_trivial",
"together_list_p99_vs_trivial"}.
"""

import argparse
import asyncio
import json
import os
import random
import secrets
import socket
import subprocess
import sys
import time

import _setup

from tests.ports import free_port

DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpucloud_bench")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
INSTANCE_BODY = {"image": 0, "gpu_type": 0, "gpus": "0.1", "cpu_cores": 1, "memory_gb": 1, "disk_gb": 10}


def server_env(port: int) -> dict:
    return {
        **_setup.production_environ(),
        "DATABASE_URL": DATABASE_URL,
        "REDIS_URL": REDIS_URL,
        "SECRET_KEY": secrets.token_urlsafe(40),
        "DEBUG": "false",
        "WEB_BIND": f"127.0.0.1:{port}",
        "SCHEDULER_QUEUE": "bench-scheduler",
        "THROTTLE_USER": "100000000/min",
        "THROTTLE_CREATE": "100000000/min",
        "THROTTLE_ANON": "100000000/min",
        "MAX_QUEUED_PER_USER": "100000",
        "SIGNUP_CREDIT": "1000000",  # the account pays for its instances (an empty wallet cannot create)
    }


def prepare(env: dict) -> dict:
    """A fresh database with the demo catalog, a simulated node and an account holding 20 instances."""
    _setup.database_create(DATABASE_URL)
    manage = [sys.executable, str(_setup.ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "--no-input", "-v0"], env=env, check=True)
    subprocess.run([*manage, "make_signing_keys"], env=env, check=True)  # creating sends signed messages
    script = """
from decimal import Decimal
from django.contrib.auth import get_user_model
from portal.services.tokens import token_create
from portal.services import work
from portal.services.requests import InstanceRequest
from portal.services.demo import catalog_load, stand_in_load
from portal.models import GpuType
from agent.gpus import simulated_inventory
from scheduler.services.nodes import node_register
catalog_load()
node_register(name="bench-node", hostname="bench", cpu_cores=512, memory_mb=1 << 21,
              gpus=simulated_inventory("sim:8xRTX3090", "bench-node"), simulated=True, nvidia_runtime=False)
user = get_user_model().objects.create_user("bench", password="bench-pass-123")
image, gpu_type = stand_in_load(), GpuType.objects.get(name="RTX3090")  # the catalog's own are building
ids = [work.instance_create(InstanceRequest(owner=user, name=f"i{n}", image_id=image.pk, gpu_type_id=gpu_type.pk,
       gpus=Decimal("0.1"), cpu_cores=1, memory_gb=1, disk_gb=10)).pk for n in range(20)]
print(token_create(user=user, name='bench')[1], image.pk, gpu_type.pk, ",".join(map(str, ids)))
"""
    out = subprocess.run([*manage, "shell", "-c", script], env=env, check=True, capture_output=True, text=True)
    token, image, gpu_type, ids = out.stdout.split()[-4:]
    return {"token": token, "image": int(image), "gpu_type": gpu_type, "ids": [int(i) for i in ids.split(",")]}


class Connection:
    """One keep-alive HTTP/1.1 connection; ``request`` returns (status, body)."""

    def __init__(self, port: int, headers: str):
        self.port, self.headers = port, headers
        self.reader = self.writer = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{self.headers}Content-Length: {len(body)}\r\n"
        if body:
            head += "Content-Type: application/json\r\n"
        self.writer.write(head.encode() + b"\r\n" + body)
        status_line = await self.reader.readline()
        if not status_line:  # the server closed an idle keep-alive connection: reconnect once
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
            self.writer.write(head.encode() + b"\r\n" + body)
            status_line = await self.reader.readline()
        length, close = 0, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "connection" and value.strip().lower() == "close":
                close = True
        data = await self.reader.readexactly(length)
        if close:
            self.writer.close()
            self.reader = self.writer = None
        return int(status_line.split()[1]), data


MIX = {"list": 70, "detail": 20, "create": 5, "release": 5}
PATHS = {"healthz": "/healthz/", "trivial": "/api/v1/me/", "list": "/api/v1/instances/"}


class Traffic:
    """The requests the loops send, one ``kind`` at a time (a key of ``MIX`` or ``PATHS``); the instances it
    creates are the ones it releases (a release with none left lists instead)."""

    def __init__(self, data: dict):
        self.data = data
        self.created: list[int] = []
        self.rng = random.Random(7)
        self.body = json.dumps(INSTANCE_BODY | {"image": data["image"], "gpu_type": data["gpu_type"]}).encode()

    def pick(self, mix: dict) -> str:
        return self.rng.choices(list(mix), weights=list(mix.values()))[0]

    async def send(self, connection: "Connection", kind: str) -> int:
        if kind in PATHS:
            return (await connection.request("GET", PATHS[kind]))[0]
        if kind == "detail":
            return (await connection.request("GET", f"/api/v1/instances/{self.rng.choice(self.data['ids'])}/"))[0]
        if kind == "create":
            status, answer = await connection.request("POST", "/api/v1/instances/", self.body)
            if status == 201:
                self.created.append(json.loads(answer)["id"])
            return status
        if self.created:
            return (await connection.request("POST", f"/api/v1/instances/{self.created.pop()}/release/"))[0]
        return (await connection.request("GET", PATHS["list"]))[0]


async def closed_loop(port: int, headers: str, traffic: Traffic, mix: dict, clients: int, seconds: float) -> float:
    """Requests per second with ``clients`` each sending its next request (of ``mix``) when the last one answered."""
    done = 0
    deadline = time.monotonic() + seconds

    async def client():
        nonlocal done
        connection = Connection(port, headers)
        while time.monotonic() < deadline:
            status = await traffic.send(connection, traffic.pick(mix))
            assert status < 400, status
            done += 1

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    return done / (time.monotonic() - started)


async def open_loop(
    port: int, headers: str, traffic: Traffic, mix: dict, rate: float, seconds: float, by_kind: dict | None = None
) -> tuple[list[float], list]:
    """Poisson arrivals at ``rate``/s of ``mix``; latency from each request's scheduled time (also in
    ``by_kind``, per kind, when given)."""
    idle: list[Connection] = []
    latencies: list[float] = []
    errors = []

    async def one(scheduled: float, kind: str):
        connection = idle.pop() if idle else Connection(port, headers)
        status = await traffic.send(connection, kind)
        latencies.append(time.monotonic() - scheduled)
        if by_kind is not None:
            by_kind.setdefault(kind, []).append(latencies[-1])
        if status >= 400:
            errors.append((kind, status))
        idle.append(connection)

    tasks = []
    start = time.monotonic()
    at = start
    while at < start + seconds:
        at += traffic.rng.expovariate(rate)
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        tasks.append(asyncio.create_task(one(at, traffic.pick(mix))))
    await asyncio.gather(*tasks)
    if errors:
        print(f"warning: {len(errors)} error answers, e.g. {errors[:3]}", file=sys.stderr)
    return latencies, errors


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--closed-seconds", type=float, default=8)
    args = _setup.parse(parser, seconds=3, closed_seconds=1)
    port = free_port()
    env = server_env(port)
    data = prepare(env)
    server = subprocess.Popen(
        [str(_setup.ROOT / ".venv/bin/gunicorn"), "-c", "config/gunicorn.py", "config.wsgi:application"],
        env=env,
        cwd=_setup.ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        auth = f"Authorization: Token {data['token']}\r\n"
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        traffic = Traffic(data)
        asyncio.run(closed_loop(port, auth, traffic, {"list": 1}, 4, 2))  # warm every worker
        capacity = {}
        for clients in (1, 50):
            capacity["healthz", clients] = asyncio.run(
                closed_loop(port, auth, traffic, {"healthz": 1}, clients, args.closed_seconds)
            )
            # The list and the trivial view in turns (ABBA), half the time each turn, averaged: their ratio, and
            # the open-loop rates below (half of each), are then taken over the same stretch of the machine's
            # speed (one kind measured alone before the other read 249 to 520 requests/s for the trivial view).
            for kind in ("list", "trivial", "trivial", "list"):
                rps = asyncio.run(closed_loop(port, auth, traffic, {kind: 1}, clients, args.closed_seconds / 2))
                capacity[kind, clients] = capacity.get((kind, clients), 0.0) + rps / 2
            for kind in ("healthz", "trivial", "list"):
                rps = capacity[kind, clients]
                print(f"closed loop {PATHS[kind]} x{clients} clients: {rps:.0f} requests/s", file=sys.stderr)
        capacity["mix", 50] = asyncio.run(closed_loop(port, auth, traffic, MIX, 50, args.closed_seconds))
        print(f"closed loop mix x50 clients: {capacity['mix', 50]:.0f} requests/s", file=sys.stderr)
        latencies, errors = asyncio.run(open_loop(port, auth, traffic, MIX, capacity["mix", 50] / 2, args.seconds))
        # The list alone against the trivial view alone, each at half its own capacity, in turns (ABBA, so a
        # drift over the run weighs on both), after a checkpoint (the mix's writes flushed now, not during one).
        subprocess.run(["psql", DATABASE_URL, "-qc", "CHECKPOINT"], check=True)
        alone: dict[str, list] = {"list": [], "trivial": []}
        for kind in ("list", "trivial", "trivial", "list"):
            rate = capacity[kind, 50] / 2
            more, failed = asyncio.run(open_loop(port, auth, traffic, {kind: 1}, rate, args.seconds / 2))
            alone[kind].extend(more)
            errors.extend(failed)
        # Both in one stream, each at a quarter of its capacity (half the server's in all), request by request:
        # a stall of the machine (bursts of slow answers a second or two long are seen with either alone)
        # then falls on both kinds alike, and the ratio is the list's own tail against the trivial view's.
        together: dict[str, list] = {}
        rates = {kind: capacity[kind, 50] / 4 for kind in ("list", "trivial")}
        _, failed = asyncio.run(open_loop(port, auth, traffic, rates, sum(rates.values()), args.seconds, together))
        errors.extend(failed)
    finally:
        server.terminate()
        server.wait(20)
    list_rps = capacity["list", 50]
    result = {
        "rps": round(list_rps, 1),
        "trivial_rps": round(capacity["trivial", 50], 1),
        "ratio_vs_trivial": round(list_rps / capacity["trivial", 50], 2),
        "healthz_rps": round(capacity["healthz", 50], 1),
        "rps_1_client": round(capacity["list", 1], 1),
        "scaling_1_to_50": round(list_rps / capacity["list", 1], 2),
        "mix_rps": round(capacity["mix", 50], 1),
        "open_loop_rate": round(capacity["mix", 50] / 2, 1),
        "requests": len(latencies),
        "p50_ms": round(1000 * percentile(latencies, 0.50), 1),
        "p99_ms": round(1000 * percentile(latencies, 0.99), 1),
        "list_p99_ms": round(1000 * percentile(alone["list"], 0.99), 1),
        "trivial_p99_ms": round(1000 * percentile(alone["trivial"], 0.99), 1),
    }
    result["list_p99_vs_trivial"] = round(result["list_p99_ms"] / result["trivial_p99_ms"], 2)
    result["together_list_p99_ms"] = round(1000 * percentile(together["list"], 0.99), 1)
    result["together_trivial_p99_ms"] = round(1000 * percentile(together["trivial"], 0.99), 1)
    result["together_list_p99_vs_trivial"] = round(
        result["together_list_p99_ms"] / result["together_trivial_p99_ms"], 2
    )
    _setup.report(result, errors=len(errors))


if __name__ == "__main__":
    main()
