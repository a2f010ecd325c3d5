"""A container flooding its log next to a neighbour with a steady workload: is the host still fine?

The product's own pieces: containers made with the launcher's ``log_config`` (Docker's "local" driver,
capped, non-blocking) and the node agent's log collector (``agent/collector.py``, in this
process) storing both containers' output under a fresh WORKLOG_DIR with the product's caps. Each round:

  1. the neighbour alone for --seconds: it hashes 1 MB at a time and prints one line per hash;
  2. the neighbour again, while the flood prints as fast as it can (``yes`` of 100-byte lines through
     ``tee``, which counts what it wrote) for the same time;
  3. the neighbour beside a container as busy as the flood that prints nothing (``yes > /dev/null``):
     what the flood's CPU alone costs the neighbour, so that beside-flood / beside-busy is the cost of
     the logging (dockerd's and the collector's work).

Both containers get one CPU (as a one-card job would). Reported: what the flood printed, what the
collector kept, what it dropped with a marker (over WORKLOG_RATE_KB_S) and what the cap removed, what
never reached the collector (Docker's non-blocking buffer and its own log rotation), the flood's log
on disk (ours, bounded by WORKLOG_MAX_MB, and Docker's), the neighbour's hashes per second alone vs
beside the flood (medians over the rounds), whether every neighbour line was kept, and the Docker
engine's ping p99 in each phase. Drops the collector makes (over the rate) are counted and marked in
the log; what Docker itself loses under a flood (its non-blocking buffer, and rotations under its log
follower) never reaches the collector and can only be measured here, as printed - kept - marked.

    python bench/log_flood.py [--seconds 8] [--rounds 3]

Needs Docker (root engine); builds the catalog's stand-in image when it is missing; no database.
Ends with one JSON line.
"""

import argparse
import io
import json
import os
import secrets
import statistics
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path

import _setup

NODE = "bench-logs"
IMAGE = "gpucloud/busybox-standin:latest"  # sh, yes, tee and wc: the BusyBox stand-in
LINE = "x" * 99  # with its newline, 100 bytes a line
FLOOD = f'exec 3>&1; timeout {{seconds}} yes {LINE} | tee /dev/fd/3 | wc -c > /tmp/count; echo "flood over"'
BUSY = f"timeout {{seconds}} yes {LINE} > /dev/null; echo 0 > /tmp/count"  # the same CPU, printing nothing
NEIGHBOUR = (
    "i=0; end=$(( $(date +%s) + {seconds} )); while [ $(date +%s) -lt $end ]; do "
    'head -c 1048576 /dev/zero | sha256sum > /dev/null; i=$((i+1)); echo "hash $i"; done; echo $i > /tmp/count'
)
MB = 1024 * 1024


def stored_lines(workload_id: int, run: int):
    """Every stored line of a run, decoded, as the relay reads them (worklogs.RunReader)."""
    from agent import worklogs

    reader = worklogs.RunReader(workload_id, run)
    while not reader.caught_up:
        for line in reader.more():
            yield json.loads(line)


def setup(workdir: Path) -> None:
    os.environ.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        SECRET_KEY=os.environ.get("SECRET_KEY") or secrets.token_urlsafe(40),
        DATABASE_URL=f"sqlite:///{workdir / 'unused.sqlite3'}",
        WORKLOG_DIR=str(workdir / "worklogs"),
        DEPLOYMENT_ID=f"bench-{uuid.uuid4().hex[:8]}",
        LOG_LEVEL="WARNING",
    )
    import django

    django.setup()


def start(client, workload_id: int, script: str, seconds: int):
    from django.conf import settings

    from agent import worklogs
    from agent.launcher import LABEL, log_config

    uid = uuid.uuid4().hex[:12]
    name = f"gpucloud-bench-{uid}"
    worklogs.run_begin(workload_id=workload_id, uid=uid, owner_id=1, run=1, container=name)
    labels = {
        f"{LABEL}.node": NODE,
        f"{LABEL}.deployment": settings.DEPLOYMENT_ID,
        f"{LABEL}.workload": str(workload_id),
        f"{LABEL}.uid": uid,
        f"{LABEL}.owner": "1",
    }
    return client.containers.run(
        IMAGE,
        ["sh", "-c", script.format(seconds=seconds)],
        name=name,
        labels=labels,
        detach=True,
        nano_cpus=int(1e9),
        network_mode="none",
        log_config=log_config(),
    )


def count_in(container) -> int:
    stream, _ = container.get_archive("/tmp/count")
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
        return int(archive.extractfile(archive.getmembers()[0]).read().strip() or 0)


def finished(workload_id: int, timeout: float = 300):
    from agent import worklogs

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = worklogs.state_read(workload_id, 1)
        if state is not None and state.finished:
            return state
        time.sleep(0.2)
    import faulthandler

    faulthandler.dump_traceback()
    raise SystemExit(f"the collector did not finish workload {workload_id}'s log in {timeout} s")


def ping_p99(client, stop: threading.Event, out: list) -> None:
    while not stop.is_set():
        began = time.perf_counter()
        client.api.ping()
        out.append((time.perf_counter() - began) * 1000)
        stop.wait(0.05)


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def docker_log_bytes(container) -> int:
    folder = Path("/var/lib/docker/containers") / container.id / "local-logs"
    return folder_bytes(folder)


def phase(client, ids, seconds: int, *, flood: bool, busy: bool = False) -> dict:
    from agent import worklogs

    pings, stop = [], threading.Event()
    pinger = threading.Thread(target=ping_p99, args=(client, stop, pings), daemon=True)
    pinger.start()
    neighbour_id = next(ids)
    flooder = start(client, next(ids), FLOOD, seconds) if flood else None
    quiet = start(client, next(ids), BUSY, seconds) if busy else None
    neighbour = start(client, neighbour_id, NEIGHBOUR, seconds)
    cpu = time.process_time()
    neighbour.wait(timeout=seconds + 120)
    result = {"neighbour_ops_s": count_in(neighbour) / seconds}
    if flooder is not None:
        flooder.wait(timeout=seconds + 120)
    stop.set()
    pinger.join()
    state = finished(neighbour_id)
    result["neighbour_lines_kept"] = (
        state.kept_bytes > 0 and state.seq == count_in(neighbour) and not state.dropped_bytes
    )
    result["ping_p99_ms"] = sorted(pings)[int(0.99 * (len(pings) - 1))] if pings else None
    if flooder is not None:
        flood_id = int(flooder.labels["gpucloud.workload"])
        state = finished(flood_id)
        result["collector_cpu_s"] = time.process_time() - cpu
        printed = count_in(flooder)
        folder = worklogs.workload_dir(flood_id)
        markers = sum(1 for line in stored_lines(flood_id, 1) if line["stream"] == "system")
        result |= {
            "printed": printed,
            "kept": state.kept_bytes,
            "dropped_marked": state.dropped_bytes,
            "cap_removed": state.head_dropped_bytes,
            "markers": markers,
            "log_dir": folder_bytes(folder),
            "docker_log": docker_log_bytes(flooder),
        }
        flooder.remove(force=True)
    if quiet is not None:
        quiet.remove(force=True)
    neighbour.remove(force=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = _setup.parse(parser, seconds=2, rounds=1)
    with tempfile.TemporaryDirectory() as workdir:
        setup(Path(workdir))
        from django.conf import settings

        from agent.collector import Collector
        from agent.images import stand_in_ensure
        from agent.launcher import docker_client

        client = docker_client()
        stand_in_ensure(IMAGE)  # as make test does: no registry is needed
        collector = Collector(NODE, client.api).start()
        ids = iter(range(1, 10_000))
        alone, beside, busy = [], [], []
        try:
            for _ in range(args.rounds):
                alone.append(phase(client, ids, args.seconds, flood=False))
                beside.append(phase(client, ids, args.seconds, flood=True))
                busy.append(phase(client, ids, args.seconds, flood=False, busy=True))
        finally:
            collector.stop()
            for container in client.containers.list(all=True, filters={"label": f"gpucloud.node={NODE}"}):
                container.remove(force=True)

        def median(rows, key):
            return statistics.median(row[key] for row in rows)

        printed = median(beside, "printed")
        kept, marked, removed = median(beside, "kept"), median(beside, "dropped_marked"), median(beside, "cap_removed")
        ops_alone, ops_beside = median(alone, "neighbour_ops_s"), median(beside, "neighbour_ops_s")
        ops_busy = median(busy, "neighbour_ops_s")
        result = {
            "seconds": args.seconds,
            "rounds": args.rounds,
            "flood_printed_mb": round(printed / MB, 1),
            "flood_rate_mb_s": round(printed / MB / args.seconds, 1),
            "flood_kept_mb": round(kept / MB, 1),
            "flood_dropped_marked_mb": round(marked / MB, 1),
            "flood_lost_before_collector_mb": round(max(0, printed - kept - marked) / MB, 1),
            "flood_cap_removed_mb": round(removed / MB, 1),
            "flood_markers": median(beside, "markers"),
            "log_dir_mb": round(max(r["log_dir"] for r in beside) / MB, 1),
            "log_cap_mb": settings.WORKLOG_MAX_MB,
            "docker_log_mb": round(max(r["docker_log"] for r in beside) / MB, 1),
            "docker_log_cap_mb": settings.WORKLOG_DOCKER_MAX_MB,
            "neighbour_ops_s_alone": round(ops_alone, 2),
            "neighbour_ops_s_beside_flood": round(ops_beside, 2),
            "neighbour_slowdown": round(ops_alone / ops_beside, 3) if ops_beside else None,
            "neighbour_ops_s_beside_quiet_busy": round(ops_busy, 2),
            "neighbour_slowdown_from_logging": round(ops_busy / ops_beside, 3) if ops_beside else None,
            "neighbour_lines_all_kept": all(r["neighbour_lines_kept"] for r in alone + beside),
            "dockerd_ping_p99_ms_alone": round(median(alone, "ping_p99_ms"), 1),
            "dockerd_ping_p99_ms_beside_flood": round(median(beside, "ping_p99_ms"), 1),
            "dockerd_ping_p99_ms_beside_quiet_busy": round(median(busy, "ping_p99_ms"), 1),
            "collector_cpu_s": round(median(beside, "collector_cpu_s"), 2),
            "rate_kb_s": settings.WORKLOG_RATE_KB_S,
            "host_cpus": os.cpu_count(),
        }
    _setup.report(result, errors=0)


if __name__ == "__main__":
    main()
