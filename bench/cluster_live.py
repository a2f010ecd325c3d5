"""The live system on several hosts: short jobs with Philly's size mix through the API, measured
against what ``manage.py simulate`` predicts for the same jobs on the same cluster.

Brings up its own cluster with config/dev/cluster.sh (needs root; prefix gcb, 10.237-10.239): the
control plane and three GPU hosts, each in its own network namespace with its own Docker engine and
node agent (h1 and h3: 4 simulated RTX 3090s each, h2: 4 A100s), the fenced tenants' network.

The jobs: ``--jobs`` consecutive jobs of Microsoft Philly (Jeon et al., ATC'19) from day 28 on, with
the usual filters (at least 60 s, under 1,000 GPU-hours) and at most 4 GPUs (one host's worth), so
the size mix is Philly's (97 % one card). Their durations are compressed to seconds, keeping their
order: ``1 + ln(philly_seconds / 60)`` (1 s to about 10 s). They arrive as a Poisson process whose
rate makes their own time ``--load`` of the 12 cards (``--arrivals philly``: Philly's own submit
times scaled to that mean, bursts included: a queue hundreds deep at times). Two jobs in three ask
for RTX 3090s, one for A100s. Each runs ``sleep <seconds>`` in the catalog image, submitted through
the API at its time.

The simulator replays the very jobs (their live submit times, durations, sizes and models) on the
same three hosts with the same policy and placement (MLFQ, FGD) and a decision every
SCHEDULER_TICK_S. What it does not model is given to it as ``--launch-overhead``, measured in this
run: the mean time a live job held its cards outside its own run (placement -> container started,
plus container exit -> recorded), and the mean time a freed card stayed idle while jobs waited
(its end recorded -> the next placement: the live tick's reaction). The result also shows the
simulation with the launch and exit only, with each job's own live overhead instead of the mean
(the variance of launches under contention lengthens queues too), and with no overhead at all.

    sudo python bench/cluster_live.py [--jobs 2000] [--load 0.7] [--arrivals poisson]

Ends with one JSON line: {"jobs", "jobs_per_min", "avg_jct_s", "sim_avg_jct_s", "jct_ratio_live_vs_sim",
"gpu_used_pct", ...}; target: the ratio within 10 % of 1.
"""

import argparse
import csv
import json
import math
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import _setup

from scheduler.sim.traces import read_jobs
from tests.cluster.harness import Cluster

TRACE = _setup.TRACES / "philly.csv"
CARDS_BY_MODEL = {"RTX3090": 8, "A100-80GB": 4}
CARDS = sum(CARDS_BY_MODEL.values())
NODES = "1x4xRTX3090,1x4xA100-80GB,1x4xRTX3090"  # h1, h2, h3 as cluster.sh makes them
TICK_S = 5  # the live default SCHEDULER_TICK_S; the simulator's quantum
SETTINGS = {
    "THROTTLE_CREATE": "1000000/min",
    "THROTTLE_USER": "1000000/min",
    "MAX_QUEUED_PER_USER": "100000",
    "SCHEDULER_TICK_S": str(TICK_S),
    "LOG_LEVEL": "WARNING",
    "CLUSTER_IMAGES": "gpucloud/busybox-standin:latest",  # all it runs: no PyTorch image to push
}


def workload(count: int, load: float, arrivals: str, seed: int = 1) -> list[dict]:
    jobs = [j for j in read_jobs(TRACE, min_duration=60, max_gpus=4) if j.duration * j.gpu_count < 1000 * 3600]
    window = [j for j in jobs if j.submit >= 28 * 86400][:count]
    rng = random.Random(seed)
    out = []
    for j in window:
        out.append(
            {
                "submit": j.submit - window[0].submit,
                "duration": round(1 + math.log(j.duration / 60), 2),
                "gpus": j.gpu_count,
                "model": "A100-80GB" if rng.random() < 1 / 3 else "RTX3090",
            }
        )
    work = sum(j["duration"] * j["gpus"] for j in out)
    span = work / (CARDS * load)
    if arrivals == "philly":  # Philly's own arrival times, scaled (its bursts, compressed)
        scale = span / max(out[-1]["submit"], 1)
        for j in out:
            j["submit"] *= scale
    else:  # a Poisson process at the same mean rate
        t = 0.0
        for j in out:
            j["submit"] = t
            t += rng.expovariate(len(out) / span)
    return out


def submit_all(cluster: Cluster, jobs: list[dict], errors: list) -> dict[int, dict]:
    """POST each job at its time; returns API job id -> the job."""
    submitted: dict[int, dict] = {}
    lock = threading.Lock()
    begin = time.monotonic()

    def post(job):
        delay = begin + job["submit"] - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        body = cluster.work_body(job["model"], job["gpus"], command=f"sleep {job['duration']}", name="bench")
        try:
            response = cluster.api("post", "jobs/", json=body)
        except Exception as exc:  # the web tier refused or timed out: counted, the run goes on
            errors.append(f"POST: {exc}"[:200])
            return
        if response.status_code != 201:
            errors.append(f"POST {response.status_code}: {response.text[:150]}")
            return
        with lock:
            submitted[response.json()["id"]] = job

    # Jobs are due in order; a few threads keep a slow answer from delaying the next submissions.
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(post, jobs))
    return submitted


def wait_finished(cluster: Cluster, ids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ((unfinished,),) = cluster.sql(
            "SELECT count(*) FROM portal_job j JOIN scheduler_workload w ON w.id = j.workload_id "
            "WHERE j.id = ANY(%s) AND w.status NOT IN ('succeeded', 'failed', 'stopped', 'released')",
            [ids],
        )
        if unfinished == 0:
            return
        print(f"\r{unfinished} jobs not finished   ", end="", file=sys.stderr, flush=True)
        time.sleep(2)
    raise SystemExit(f"jobs still unfinished after {timeout:.0f}s")


def outcomes(cluster: Cluster, submitted: dict[int, dict]) -> list[dict]:
    rows = cluster.sql(
        "SELECT j.id, w.status, w.created_at, (SELECT min(e.created_at) FROM scheduler_workloadevent e "
        "WHERE e.workload_id = w.id AND e.to_status = 'starting'), w.started_at, w.finished_at "
        "FROM portal_job j JOIN scheduler_workload w ON w.id = j.workload_id WHERE j.id = ANY(%s)",
        [list(submitted)],
    )
    return [
        submitted[job_id] | dict(status=status, created=c, placed=p, started=s, finished=f)
        for job_id, status, c, p, s, f in rows
    ]


def reactions(done: list[dict]) -> float:
    """Mean seconds a card stayed idle before a job that waited for it got it: the live scheduler's
    reaction (a job's end recorded -> the next placement on a card of that model).

    Every placement takes the earliest freed cards of its model that are free by then, as many as
    it asks for; a job that waited for them waited until the last one was freed (or it arrived).
    Jobs that got a card free before they arrived waited for no card and are left out.
    """
    gaps = []
    for model, cards in CARDS_BY_MODEL.items():
        jobs = [j for j in done if j["model"] == model]
        free = [None] * cards  # None: free from the start
        frees = sorted((j["finished"], j["gpus"]) for j in jobs)
        k = 0
        for j in sorted(jobs, key=lambda j: j["placed"]):
            while k < len(frees) and frees[k][0] <= j["placed"]:
                free += [frees[k][0]] * frees[k][1]
                k += 1
            if len(free) < j["gpus"]:
                continue  # the records' order disagrees by a few milliseconds: leave it out
            taken, free = free[: j["gpus"]], free[j["gpus"] :]
            if None in taken or max(taken) <= j["created"]:
                continue
            gaps.append((j["placed"] - max(taken)).total_seconds())
    return statistics.mean(gaps) if gaps else 0.0


def simulate(done: list[dict], t0, overhead: float, *, held: bool = False) -> dict:
    """``manage.py simulate`` on the jobs as they were submitted live; ``held``: each job runs for as
    long as it held its cards live (its own launch and exit included) instead of its sleep."""
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        writer = csv.writer(f)
        writer.writerow(["submit_time", "duration", "num_gpus", "gpu_model"])
        for j in done:
            duration = (j["finished"] - j["placed"]).total_seconds() if held else j["duration"]
            writer.writerow([(j["created"] - t0).total_seconds(), duration, j["gpus"], j["model"]])
    command = [sys.executable, "manage.py", "simulate", "--trace", f.name, "--nodes", NODES]
    command += ["--placement", "fgd", "--quantum", str(TICK_S), "--launch-overhead", str(overhead)]
    env = {**os.environ, "SECRET_KEY": secrets.token_urlsafe(40), "DATABASE_URL": "sqlite:///:memory:"}
    result = subprocess.run(command, cwd=_setup.ROOT, env=env, capture_output=True, text=True, check=True)
    os.unlink(f.name)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--load", type=float, default=0.7, help="offered load of the jobs' own time on 12 cards")
    parser.add_argument(
        "--arrivals", choices=["poisson", "philly"], default="poisson", help="Poisson, or Philly's own times scaled"
    )
    parser.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    args = _setup.parse(parser, jobs=20)
    jobs = workload(args.jobs, args.load, args.arrivals)
    cluster = Cluster(
        prefix=_setup.CLUSTER_PREFIX,
        net=_setup.CLUSTER_NET,
        directory=_setup.ROOT / "var" / "cluster-bench",
        settings=SETTINGS,
    )
    errors: list[str] = []
    cluster.up(3)
    try:
        started = time.monotonic()
        submitted = submit_all(cluster, jobs, errors)
        wait_finished(cluster, list(submitted), timeout=jobs[-1]["submit"] + 3600)
        wall = time.monotonic() - started
        results = outcomes(cluster, submitted)
    finally:
        if not args.keep:
            cluster.down()
    print(file=sys.stderr)

    done = [j for j in results if j["status"] == "succeeded"]
    errors += [f"job {j['status']}" for j in results if j["status"] != "succeeded"]
    t0 = min(j["created"] for j in results)
    makespan = (max(j["finished"] for j in done) - t0).total_seconds()
    launch = [(j["started"] - j["placed"]).total_seconds() for j in done]
    exit_ = [(j["finished"] - j["started"]).total_seconds() - j["duration"] for j in done]
    reaction = reactions(done)
    overhead = statistics.mean(launch) + statistics.mean(exit_)
    held = sum(j["gpus"] * (j["finished"] - j["placed"]).total_seconds() for j in done)
    busy = sum(j["gpus"] * j["duration"] for j in done)
    avg_jct = statistics.mean((j["finished"] - j["created"]).total_seconds() for j in done)
    sim = simulate(done, t0, overhead + reaction)
    sim_launch = simulate(done, t0, overhead)
    sim_plain = simulate(done, t0, 0.0)
    sim_held = simulate(done, t0, reaction, held=True)
    _setup.report(
        {
            "setup": "cluster.sh: 3 hosts (netns + own dockerd + agent), 2x4 RTX3090 + 1x4 A100 simulated",
            "jobs": len(results),
            "succeeded": len(done),
            "jobs_per_min": round(len(done) / makespan * 60, 1),
            "avg_jct_s": round(avg_jct, 2),
            "sim_avg_jct_s": sim["avg_jct"],
            "jct_ratio_live_vs_sim": round(avg_jct / sim["avg_jct"], 3),
            "gpu_used_pct": round(100 * held / (CARDS * makespan), 1),
            "gpu_busy_pct": round(100 * busy / (CARDS * makespan), 1),
            "sim_gpu_allocation_pct": sim["gpu_allocation_pct"],
            "sim_overhead_s": round(overhead + reaction, 3),
            "launch_s": round(statistics.mean(launch), 3),
            "exit_s": round(statistics.mean(exit_), 3),
            "reaction_s": round(reaction, 3),
            "sim_avg_jct_s_launch_and_exit_only": sim_launch["avg_jct"],
            "jct_ratio_launch_and_exit_only": round(avg_jct / sim_launch["avg_jct"], 3),
            "sim_avg_jct_s_each_jobs_own_overhead": sim_held["avg_jct"],
            "jct_ratio_each_jobs_own_overhead": round(avg_jct / sim_held["avg_jct"], 3),
            "sim_avg_jct_s_without_overhead": sim_plain["avg_jct"],
            "avg_job_s": round(statistics.mean(j["duration"] for j in done), 2),
            "offered_load": args.load,
            "arrivals": args.arrivals,
            "makespan_s": round(makespan, 1),
            "wall_s": round(wall, 1),
            "error_examples": errors[:3],
        },
        errors=len(errors),
    )


if __name__ == "__main__":
    main()
