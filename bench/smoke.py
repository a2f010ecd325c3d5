"""``make bench-smoke``: every bench/ script at a small size, failing on any error, never on timing.

The list is built from the scripts present in bench/ and ``SMOKE`` below, the one table of how each
runs small (its ``--quick`` sizes live in the script, next to its full ones). A script without an
entry fails the run: a new bench says how it runs small, nothing is left out silently. An entry
whose script is not on this branch (a bench another branch adds) is named, not run.

A script fails when it exits non-zero, runs past its time limit, ends without a JSON line carrying
"errors" and "commit", or reports ``errors`` > 0 on any JSON line. Timings are printed, never
judged. Benches that need several GPU hosts (cluster_live, gang_allreduce, launch_latency) bring up their own
instance of config/dev/cluster.sh's address plan (CLUSTER_PREFIX / CLUSTER_NET, default gcb / 237)
and take it down again; they, and those that start containers, need root and Docker, as
``make test`` does.

    python bench/smoke.py [script.py ...]     # all of them by default

The benches that bring up their own several-host cluster (its own PostgreSQL, Redis and engines) run in a
lane of their own beside the others (two lanes, each script after the one before it in its lane): the run
costs the longer lane, not the sum. Each script's output is printed whole when it ends.

Ends with one JSON line: {"scripts", "failed", "seconds", "errors", "commit"}.
"""

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import _setup

BENCH = _setup.ROOT / "bench"
# gpu_check.py needs an NVIDIA card and root (bench/gpu_check.sh; its last output is in the README).
NOT_BENCHES = {"_setup.py", "_tick_rounds.py", "smoke.py", "gpu_check.py"}


@dataclass(frozen=True)
class Smoke:
    args: tuple[str, ...] = ("--quick",)
    timeout_s: int = 300
    env: dict = field(default_factory=dict)
    lane: str = "local"  # "cluster": brings up a cluster of its own, shares nothing with the local lane


SMOKE = {
    "api_load.py": Smoke(),
    "billing_settle.py": Smoke(),
    "cluster_live.py": Smoke(timeout_s=600, lane="cluster"),
    "disk_history.py": Smoke(),
    "elastic.py": Smoke(),
    "fgd_allocation.py": Smoke(),
    "gang_allreduce.py": Smoke(timeout_s=600, lane="cluster"),
    "io_mlfq.py": Smoke(),
    "io_neighbour.py": Smoke(),
    "launch_latency.py": Smoke(timeout_s=600, lane="cluster"),
    "log_flood.py": Smoke(),
    "philly_jct.py": Smoke(),
    "relay_latency.py": Smoke(),
    "scheduler_throughput.py": Smoke(),
    "share_classes.py": Smoke(),
    "sharedfs_io.py": Smoke(),
    "sweep_cost.py": Smoke(),
    "telemetry_sample.py": Smoke(),
    "tick_latency.py": Smoke(),
    "tick_steady.py": Smoke(),
    "ws_fanout.py": Smoke(),
    "ws_viewers.py": Smoke(),
}


def scripts() -> tuple[list[str], list[str], list[str]]:
    """(scripts to run, scripts without an entry, entries without a script)."""
    present = sorted(p.name for p in BENCH.glob("*.py") if p.name not in NOT_BENCHES)
    return present, [s for s in present if s not in SMOKE], sorted(set(SMOKE) - set(present))


def failure(returncode: int, stdout: str) -> str | None:
    """Why a run failed, or None. Every JSON line's "errors" counts; the last one must carry errors and commit."""
    if returncode:
        return f"exit status {returncode}"
    lines = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    if not lines or "errors" not in lines[-1] or "commit" not in lines[-1]:
        return 'no final JSON line with "errors" and "commit"'
    errors = sum(line.get("errors") or 0 for line in lines)
    return f"errors: {errors}" if errors else None


PRINTING = threading.Lock()


def run(script: str) -> tuple[str | None, float]:
    """Run one script; its output (stdout, then stderr) is printed whole once it has ended."""
    smoke = SMOKE[script]
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, str(BENCH / script), *smoke.args],
            cwd=_setup.ROOT,
            env={**os.environ, **smoke.env},
            capture_output=True,
            text=True,
            timeout=smoke.timeout_s,
        )
    except subprocess.TimeoutExpired as exc:
        stdout, stderr = (_text(exc.stdout), _text(exc.stderr))
        why = f"ran past {smoke.timeout_s} s"
    else:
        stdout, stderr, why = done.stdout, done.stderr, failure(done.returncode, done.stdout)
    seconds = time.monotonic() - started
    with PRINTING:
        sys.stderr.write(stderr)
        sys.stdout.write(stdout)
        sys.stdout.flush()
        outcome = f"FAILED: {why}" if why else "ok"
        print(f"bench-smoke: {script} {outcome} ({seconds:.0f} s)", file=sys.stderr, flush=True)
    return why, seconds


def _text(output) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def lane(scripts: list[str]) -> dict[str, str]:
    """Run ``scripts`` one after another: {script: why} for those that failed."""
    failed = {}
    for script in scripts:
        with PRINTING:
            print(f"bench-smoke: {script} {' '.join(SMOKE[script].args)}", file=sys.stderr, flush=True)
        why, _ = run(script)
        if why:
            failed[script] = why
    return failed


def main():
    chosen = sys.argv[1:]
    present, unlisted, absent = scripts()
    for script in absent:
        print(f"bench-smoke: {script} has an entry but is not on this branch: not run", file=sys.stderr)
    failed = {script: "no entry in bench/smoke.py SMOKE: say how it runs small" for script in unlisted}
    started = time.monotonic()
    lanes: dict[str, list[str]] = {}
    for script in chosen or [s for s in present if s in SMOKE]:
        if script not in SMOKE:
            failed[script] = "no such bench, or no entry in SMOKE"
            continue
        lanes.setdefault(SMOKE[script].lane, []).append(script)
    with ThreadPoolExecutor(max_workers=max(1, len(lanes))) as pool:
        for lane_failed in pool.map(lane, lanes.values()):
            failed.update(lane_failed)
    for script, why in failed.items():
        print(f"bench-smoke: FAILED {script}: {why}", file=sys.stderr)
    _setup.report(
        {"scripts": len(chosen or present), "failed": sorted(failed), "seconds": round(time.monotonic() - started)},
        errors=len(failed),
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
