"""Terminal and files through the node agent's relay, against Docker direct on the same host.

The real processes: a node agent (``manage.py node_agent``, serving its relay), the
scheduler worker with beat, gunicorn (HTTP) and daphne (WebSockets) — the web tier
with no Docker engine to reach — on a fresh database. One instance runs; then
(1) keystroke echo: a key sent over a WebSocket to daphne → relay → ``docker exec``
    TTY → back, one at a time at typing pace, against the same through a
    ``docker exec`` TTY socket opened by this process;
(2) a 100 MB file downloaded through the files page (gunicorn → relay → Docker's
    archive API), written to disk, against ``docker cp`` of the same file.

    python bench/relay_latency.py [--keys 500] [--mb 100] [--rounds 5]

Uses its own PostgreSQL database (gpucloud_relay_bench, recreated) and Redis database 10.
Ends with one JSON line: {"echo_p99_ms", "echo_p50_ms", "direct_echo_p99_ms", "download_mb_s",
"direct_mb_s", "download_ratio_vs_direct", "errors", "commit"}.
"""

import argparse
import asyncio
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import _setup

from tests.ports import free_port

DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpucloud_relay_bench")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/10")
NODE = "bench-relay"
ERRORS: list[str] = []


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def start_cluster(env: dict, web_port: int, ws_port: int, logs: str) -> list[subprocess.Popen]:
    python, root = sys.executable, str(_setup.ROOT)
    web_env = env | {"DOCKER_BASE_URL": "unix:///nonexistent/docker.sock"}  # the web tier has no Docker
    commands = [
        ([python, "manage.py", "node_agent", "--name", NODE], env),
        ([python, "-m", "celery", "-A", "config", "worker", "-B", "-Q", env["SCHEDULER_QUEUE"], "--pool", "threads",
          "-s", f"{logs}/beat-schedule", "--without-gossip", "--without-mingle"], env),
        ([python, "-m", "gunicorn", "-c", "config/gunicorn.py", "config.wsgi:application"],
         web_env | {"WEB_BIND": f"127.0.0.1:{web_port}", "WEB_WORKERS": "2"}),
        ([python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(ws_port), "config.asgi:application"], web_env),
    ]  # fmt: skip
    processes = []
    for n, (command, environment) in enumerate(commands):
        log = open(f"{logs}/process-{n}.log", "w")  # noqa: SIM115  (kept for the process)
        # Each in its own process group, stopped as a group: the worker's embedded beat (-B) is a child process
        # that outlived a worker stopped alone, and kept sending ticks after the bench had ended.
        processes.append(
            subprocess.Popen(
                command, env=environment, cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
    return processes


def group_signal(process: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the process group ``process`` leads (gone already: nothing to do)."""
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def running_instance(user):
    """Create an instance as ``user`` and wait until it runs (placed by the scheduler, launched by the agent)."""
    from decimal import Decimal

    from portal.models import GpuType, Image
    from portal.services import work
    from portal.services.demo import STANDIN_NAME
    from portal.services.requests import InstanceRequest
    from scheduler.models import Node, Workload

    wait_for(lambda: Node.objects.filter(name=NODE, relay_url__startswith="http").exists(), 60, "the agent")
    image = Image.objects.get(name=STANDIN_NAME)  # the BusyBox stand-in: a shell and dd are all it needs
    instance = work.instance_create(InstanceRequest(
        owner=user, name="bench", image_id=image.pk, gpu_type_id=GpuType.objects.get(name="RTX3090").pk,
        gpus=Decimal("1"), cpu_cores=1, memory_gb=1, disk_gb=10,
    ))  # fmt: skip
    return wait_for(
        lambda: Workload.objects.filter(pk=instance.workload_id, status="running").first(), 90, "the instance to run"
    )


async def echo_through_relay(url: str, cookie: str, keys: int) -> list[float]:
    import websockets

    async with websockets.connect(url, additional_headers={"Origin": "http://127.0.0.1", "Cookie": cookie}) as ws:
        return await type_keys(ws.send, ws.recv, keys, lambda key: json.dumps({"type": "input", "data": key}))


def echo_direct(container: str, keys: int) -> list[float]:
    from agent.launcher import docker_client
    from agent.relay.terminal import SHELL

    api = docker_client().api
    exec_id = api.exec_create(container, SHELL, stdin=True, tty=True, environment={"TERM": "xterm-256color"})["Id"]
    stream = api.exec_start(exec_id, tty=True, socket=True)
    sock = stream._sock

    async def run():
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        return await type_keys(
            lambda data: loop.sock_sendall(sock, data), lambda: loop.sock_recv(sock, 65536), keys, str.encode
        )

    try:
        return asyncio.run(run())
    finally:
        sock.close()
        stream.close()


async def type_keys(send, recv, keys: int, frame) -> list[float]:
    """Send one key at a time and time its echo (the first output after it); a fresh line every 60 keys."""

    async def drain(quiet_s: float):
        try:
            while True:
                await asyncio.wait_for(recv(), quiet_s)
        except TimeoutError:
            pass

    await drain(1.0)  # the prompt
    delays = []
    for n in range(keys):
        if n and n % 60 == 0:
            await send(frame("\x15"))  # Ctrl-U: an empty line again
            await drain(0.3)
        start = time.perf_counter()
        await send(frame("abcdefghij"[n % 10]))
        try:
            await asyncio.wait_for(recv(), 5)
        except TimeoutError:
            ERRORS.append(f"key {n}: no echo within 5 s")
            continue
        delays.append((time.perf_counter() - start) * 1000)
        await drain(0.02)  # typing pace; anything else the shell printed
    await send(frame("\x15exit\r"))
    return delays


def download_through_relay(url: str, cookie: str, folder: str, expected: str) -> float:
    import requests

    target = os.path.join(folder, "relayed")
    start = time.perf_counter()
    with requests.get(url, headers={"Cookie": cookie}, stream=True, timeout=60) as response, open(target, "wb") as out:
        if response.status_code != 200:
            ERRORS.append(f"download answered {response.status_code}")
            return 0.0
        for chunk in response.iter_content(1 << 20):
            out.write(chunk)
    elapsed = time.perf_counter() - start
    with open(target, "rb") as written:
        if hashlib.file_digest(written, "sha256").hexdigest() != expected:
            ERRORS.append("the downloaded file differs")
    os.unlink(target)
    return elapsed


def docker_cp(container: str, path: str, folder: str) -> float:
    target = os.path.join(folder, "copied")
    start = time.perf_counter()
    subprocess.run(["docker", "cp", f"{container}:{path}", target], check=True, capture_output=True)
    elapsed = time.perf_counter() - start
    os.unlink(target)
    return elapsed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = _setup.parse(parser, keys=20, mb=4, rounds=1)
    os.environ["BENCH_REDIS_URL"] = REDIS_URL
    deployment = f"bench-relay-{uuid.uuid4().hex[:6]}"
    _setup.fresh_database(
        DATABASE_URL, DEPLOYMENT_ID=deployment, SCHEDULER_QUEUE="bench-relay-scheduler", SIGNUP_CREDIT="1000"
    )
    env = {
        # the database, Redis, a fresh SECRET_KEY for every process (relay tickets: the keys in KEYS_DIR)
        **_setup.production_environ(),
        "DEBUG": "false",
        "SCHEDULER_TICK_S": "1",
        "GPU_BACKEND": "sim:1xRTX3090",
        "RELAY_PORT": "0",
        "WHITENOISE_USE_FINDERS": "true",
    }
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    from agent.launcher import LABEL, docker_client
    from portal.services.demo import STANDIN_IMAGE, catalog_load, stand_in_load

    catalog_load()
    stand_in_load()
    call_command("build_images", "--only", STANDIN_IMAGE, verbosity=0)  # after the catalog: on this engine
    user = get_user_model().objects.create_user("bench", password="bench-pass-123")
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    web_port, ws_port = free_port(), free_port()
    logs = tempfile.mkdtemp(prefix="relay-bench-")
    processes = start_cluster(env, web_port, ws_port, logs)
    try:
        workload = running_instance(user)
        instance = workload.instance.pk
        container = workload.container_name
        path = "/root/autodl-tmp/bench.bin"
        engine = docker_client().containers.get(container)
        engine.exec_run(["dd", "if=/dev/urandom", f"of={path}", "bs=1M", f"count={args.mb}"])
        expected = engine.exec_run(["sha256sum", path]).output.split()[0].decode()

        relayed = asyncio.run(
            echo_through_relay(f"ws://127.0.0.1:{ws_port}/ws/terminal/instances/{instance}/", cookie, args.keys)
        )
        direct = echo_direct(container, args.keys)
        url = f"http://127.0.0.1:{web_port}/instances/{instance}/files/download/?path={path}"
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DISK_DIR")) as folder:
            download_through_relay(url, cookie, folder, expected)  # warm: the web workers import their views
            docker_cp(container, path, folder)
            relay_s, direct_s = [], []
            for _ in range(args.rounds):  # interleaved: both see the same machine load
                relay_s.append(download_through_relay(url, cookie, folder, expected))
                direct_s.append(docker_cp(container, path, folder))
            print("download s, relay:", [round(s, 2) for s in relay_s], "docker cp:", [round(s, 2) for s in direct_s],
                  file=sys.stderr)  # fmt: skip
    finally:
        for process in processes:
            group_signal(process, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                pass
            group_signal(process, signal.SIGKILL)  # what is left of its group (none, normally)
        mine = {"label": f"{LABEL}.deployment={deployment}"}
        for stale in docker_client().containers.list(all=True, filters=mine):
            stale.remove(force=True)
        for stale in docker_client().volumes.list(filters=mine):
            stale.remove(force=True)
    relay_mb_s = args.mb / statistics.median(relay_s) if all(relay_s) else 0.0
    direct_mb_s = args.mb / statistics.median(direct_s)
    _setup.report(
        {
            "echo_p99_ms": round(percentile(relayed, 0.99), 2) if relayed else None,
            "echo_p50_ms": round(percentile(relayed, 0.5), 2) if relayed else None,
            "direct_echo_p99_ms": round(percentile(direct, 0.99), 2) if direct else None,
            "download_mb_s": round(relay_mb_s, 1),
            "direct_mb_s": round(direct_mb_s, 1),
            "download_ratio_vs_direct": round(relay_mb_s / direct_mb_s, 2),
        },
        errors=len(ERRORS),
    )
    for error in ERRORS[:10]:
        print(error, file=sys.stderr)


if __name__ == "__main__":
    main()
