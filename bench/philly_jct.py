"""Job completion time on Microsoft Philly (Jeon et al., ATC'19): MLFQ against FIFO, SRTF and 2D-LAS.

Window: one week of the trace starting 28 days after its first submit, every
virtual cluster, jobs of at least 60 s and under 1,000 GPU-hours, of at most
8 GPUs (one node), on 32 nodes x 8 GPUs = 256 GPUs: offered load about 1.6x
capacity, so the queue is real. Same simulator and same policy code as live.

    python bench/philly_jct.py [--start-day 28] [--days 7] [--gpus 256]
"""

import argparse
import json
import time

import _setup

from scheduler.sim.simulator import simulate, uniform_nodes
from scheduler.sim.traces import read_jobs

TRACE = _setup.TRACES / "philly.csv"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start-day", type=float, default=28)
    parser.add_argument("--days", type=float, default=7)
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--full-trace-gpus", type=int, default=1024, help="cluster for the full-trace timing run")
    args = parser.parse_args()
    jobs = [j for j in read_jobs(TRACE, min_duration=60, max_gpus=8) if j.duration * j.gpu_count < 1000 * 3600]
    begin = args.start_day * 86400
    window = [j for j in jobs if begin <= j.submit < begin + args.days * 86400]
    load = sum(j.duration * j.gpu_count for j in window) / (args.gpus * args.days * 86400)
    results = {}
    for policy in ("fifo", "srtf", "las", "mlfq"):
        started = time.perf_counter()
        result = simulate(window, uniform_nodes(args.gpus), policy=policy)
        results[policy] = result
        print(json.dumps(result.summary() | {"seconds": round(time.perf_counter() - started, 1)}), flush=True)
    started = time.perf_counter()
    full = read_jobs(TRACE, max_gpus=8)
    simulate(full, uniform_nodes(args.full_trace_gpus), policy="mlfq")
    full_seconds = time.perf_counter() - started
    print(
        json.dumps(
            {
                "window_jobs": len(window),
                "gpus": args.gpus,
                "offered_load": round(load, 2),
                "avg_jct_s": {p: round(r.avg_jct) for p, r in results.items()},
                "mlfq_vs_fifo": round(results["mlfq"].avg_jct / results["fifo"].avg_jct, 3),
                "mlfq_vs_srtf": round(results["mlfq"].avg_jct / results["srtf"].avg_jct, 3),
                "full_trace_jobs": len(full),
                "full_trace_seconds": round(full_seconds, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
