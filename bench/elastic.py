"""Elastic jobs on Microsoft Philly: the same jobs rigid and elastic, average JCT and GPU allocation.

Elastic share: every multi-GPU job (2 cards or more; 7 % of the jobs, most of the GPU-time) may run
on half its cards up to all of them (``elastic_min = gpu_count // 2``); 1-card jobs stay rigid. The
MLFQ starts an elastic job at its full size if that fits, else at its minimum, grows it into idle
cards when nothing waits and shrinks it toward its minimum when queued work needs the cards, at most
once per ``resize_interval_s``. Assumptions of the simulator: linear speedup (a job on half its cards
takes twice as long), and each resize is a restart from checkpoint that holds the new cards for
``--restart-s`` seconds before the job advances again. The window and its cluster are
bench/philly_jct.py's (every job kept, cluster sized for the offered load).

    python bench/elastic.py [--start-day 28] [--days 3] [--load 1.3] [--restart-s 60] [--quick]
"""

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import _setup
import philly_jct

from scheduler.policy import MlfqConfig
from scheduler.sim.simulator import simulate, uniform_nodes
from scheduler.sim.traces import read_jobs


def run(task: tuple):
    jobs, gpus, restart_s, interval = task
    config = replace(MlfqConfig(), resize_interval_s=interval)
    started = time.perf_counter()
    result = simulate(jobs, uniform_nodes(gpus, philly_jct.PER_NODE), policy="mlfq", config=config, restart_s=restart_s)
    return result, time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start-day", type=float, default=28)
    parser.add_argument("--days", type=float, default=3)
    parser.add_argument("--load", type=float, default=1.3, help="offered load the cluster is sized for")
    parser.add_argument("--restart-s", type=float, default=60.0, help="cost of one resize (restart from checkpoint)")
    parser.add_argument("--resize-interval-s", type=float, default=MlfqConfig().resize_interval_s)
    parser.add_argument("--quick", action="store_true", help="a one-day window (a smoke run)")
    args = parser.parse_args()
    began = time.perf_counter()
    philly_jct._JOBS.extend(read_jobs(philly_jct.TRACE))
    start_day, days = (87, 1) if args.quick else (args.start_day, args.days)
    rigid, gpus, load = philly_jct.window(start_day, days, args.load)
    elastic = [replace(j, elastic_min=j.gpu_count // 2) if j.gpu_count >= 2 else j for j in rigid]
    tasks = [(jobs, gpus, args.restart_s, args.resize_interval_s) for jobs in (rigid, elastic)]
    with ProcessPoolExecutor(2) as pool:
        (r, r_seconds), (e, e_seconds) = pool.map(run, tasks)
    print(
        json.dumps(
            {
                "bench": "elastic",
                "window": f"day {start_day:g} + {days:g} days",
                "jobs": len(rigid),
                "elastic_jobs": sum(j.elastic_min is not None for j in elastic),
                "gpus": gpus,
                "offered_load": load,
                "restart_s": args.restart_s,
                "resize_interval_s": args.resize_interval_s,
                "rigid_avg_jct_s": round(r.avg_jct),
                "elastic_avg_jct_s": round(e.avg_jct),
                "rigid_p95_jct_s": round(r.p95_jct),
                "elastic_p95_jct_s": round(e.p95_jct),
                "rigid_alloc_pct": round(r.gpu_allocation_pct, 1),
                "elastic_alloc_pct": round(e.gpu_allocation_pct, 1),
                "rigid_avg_queueing_s": round(r.avg_queueing),
                "elastic_avg_queueing_s": round(e.avg_queueing),
                "resizes": e.resizes,
                "errors": (r.jobs - r.finished) + (e.jobs - e.finished),
                "sim_seconds": [round(r_seconds, 1), round(e_seconds, 1)],
                "seconds": round(time.perf_counter() - began),
                "commit": _setup.commit(),
            }
        )
    )


if __name__ == "__main__":
    main()
