"""``make bench-smoke``: every bench/ script at a small size, failing on any error, never on timing.

The list is built from the scripts present in bench/ and ``SMOKE`` below, the one table of how each
runs small (its ``--quick`` sizes live in the script, next to its full ones). A script without an
entry fails the run: a new bench says how it runs small, nothing is left out silently. An entry
whose script is not on this branch (a bench another branch adds) is named, not run.

A script fails when it exits non-zero, runs past its time limit, ends without a JSON line carrying
"errors" and "commit", or reports ``errors`` > 0 on any JSON line. Timings are printed, never
judged. Benches that need several GPU hosts (cluster_live, launch_latency) bring up their own
instance of config/dev/cluster.sh's address plan (CLUSTER_PREFIX / CLUSTER_NET, default gcb / 237)
and take it down again; they, and those that start containers, need root and Docker, as
``make test`` does.

    python bench/smoke.py [script.py ...]     # all of them by default

Ends with one JSON line: {"scripts", "failed", "seconds", "errors", "commit"}.
"""

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

import _setup

BENCH = _setup.ROOT / "bench"
NOT_BENCHES = {"_setup.py", "smoke.py"}


@dataclass(frozen=True)
class Smoke:
    args: tuple[str, ...] = ("--quick",)
    timeout_s: int = 300
    env: dict = field(default_factory=dict)


SMOKE = {
    "api_load.py": Smoke(),
    "billing_settle.py": Smoke(),
    "cluster_live.py": Smoke(timeout_s=600),
    "elastic.py": Smoke(),
    "fgd_allocation.py": Smoke(),
    "io_mlfq.py": Smoke(),
    "io_neighbour.py": Smoke(),
    "launch_latency.py": Smoke(timeout_s=600),
    "log_flood.py": Smoke(),
    "philly_jct.py": Smoke(),
    "relay_latency.py": Smoke(),
    "scheduler_throughput.py": Smoke(),
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


def run(script: str) -> tuple[str | None, float]:
    smoke = SMOKE[script]
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, str(BENCH / script), *smoke.args],
            cwd=_setup.ROOT,
            env={**os.environ, **smoke.env},
            stdout=subprocess.PIPE,
            text=True,
            timeout=smoke.timeout_s,
        )
    except subprocess.TimeoutExpired as exc:
        sys.stdout.write(exc.stdout or "")
        return f"ran past {smoke.timeout_s} s", time.monotonic() - started
    sys.stdout.write(done.stdout)
    return failure(done.returncode, done.stdout), time.monotonic() - started


def main():
    chosen = sys.argv[1:]
    present, unlisted, absent = scripts()
    for script in absent:
        print(f"bench-smoke: {script} has an entry but is not on this branch: not run", file=sys.stderr)
    failed = {script: "no entry in bench/smoke.py SMOKE: say how it runs small" for script in unlisted}
    started = time.monotonic()
    for script in chosen or [s for s in present if s in SMOKE]:
        if script not in SMOKE:
            failed[script] = "no such bench, or no entry in SMOKE"
            continue
        print(f"bench-smoke: {script} {' '.join(SMOKE[script].args)}", file=sys.stderr, flush=True)
        why, seconds = run(script)
        print(f"bench-smoke: {script} {'FAILED: ' + why if why else 'ok'} ({seconds:.0f} s)", file=sys.stderr)
        if why:
            failed[script] = why
    for script, why in failed.items():
        print(f"bench-smoke: FAILED {script}: {why}", file=sys.stderr)
    _setup.report(
        {"scripts": len(chosen or present), "failed": sorted(failed), "seconds": round(time.monotonic() - started)},
        errors=len(failed),
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
