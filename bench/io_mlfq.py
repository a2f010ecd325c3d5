"""The seed's I/O-aware MLFQ, shown: JCT of low-utilization jobs with and without the idle weighting.

Workload: the Microsoft Philly trace (Jeon et al., ATC'19) window of bench/philly_jct.py (one
week from day 28, jobs of at least 60 s, at most 8 GPUs, under 1,000 GPU-hours, 256 GPUs),
each job given a GPU utilization by ``scheduler.sim.utilization`` (default: the Alibaba PAI
2020 per-instance distribution; see that module for where it comes from). The same simulator
and policy code as live; the running jobs accrue service at their utilization.

Disciplines: ``fifo``; ``las`` (plain 2D-LAS: no idle weighting, no fair share); ``mlfq``
(the product: idle weighting and fair share); ``mlfq_no_idle`` (the product with
``idle_weight`` 1: what the idle weighting alone changes). Low-utilization jobs: below
``--low`` (0.30, the product's ``SCHEDULER_IDLE_UTIL``).

Prints one JSON line per discipline, then the summary:
{"jobs", "low_jobs", "avg_jct_s": {policy: {"all", "low", "high"}}, "mlfq_low_vs_las",
 "mlfq_all_vs_las", "mlfq_low_vs_no_idle", "mlfq_all_vs_no_idle", "target_met", "errors", "commit"}
``target_met``: the idle weighting lowers the low-utilization jobs' average JCT against plain
LAS without raising the overall average by more than 5 %.

``--sweep`` also runs the product's MLFQ with each knob of the idle weighting moved (``idle_weight``
0.1 and 0.5, ``idle_util`` 0.1 and 0.5) and with the utilization drawn with two other seeds, one line
each (plain LAS ignores utilization, so its run is shared). ``--rollups DATABASE_URL`` replays
instead the per-workload averages the platform's own minute rollups (``WorkloadGpuMinute``) hold
in that database (``scheduler.selectors.workload_utilizations``).

    python bench/io_mlfq.py [--start-day 28] [--days 7] [--gpus 256] [--seed 0] [--sweep] [--rollups URL] [--quick]
"""

import argparse
import json
import time
from dataclasses import replace

import _setup

from scheduler.policy.mlfq import MlfqConfig
from scheduler.sim.simulator import simulate, uniform_nodes
from scheduler.sim.traces import read_jobs
from scheduler.sim.utilization import PAI_2020, Distribution, attach, measured

TRACE = _setup.TRACES / "philly.csv"
POLICIES = {
    "fifo": ("fifo", None),
    "las": ("las", None),
    "mlfq": ("mlfq", None),
    "mlfq_no_idle": ("mlfq", replace(MlfqConfig(), idle_weight=1.0)),
}


def averages(result, jobs, low: float) -> dict:
    low_jobs = [j for j in jobs if j.utilization < low]
    groups = {"all": jobs, "low": low_jobs, "high": [j for j in jobs if j.utilization >= low]}
    out = {}
    for name, members in groups.items():
        jcts = [result.done[j.id] - j.submit for j in members if j.id in result.done]
        out[name] = round(sum(jcts) / len(jcts)) if jcts else None
    return out


def rollup_distribution(database_url: str) -> Distribution:
    import os
    import secrets

    import django

    os.environ.update(DATABASE_URL=database_url, DJANGO_SETTINGS_MODULE="config.settings", LOG_LEVEL="WARNING")
    os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(40))
    django.setup()
    from scheduler.selectors import workload_utilizations

    return measured(workload_utilizations(), name="rollups", source="WorkloadGpuMinute")


def sweep(window, distribution, las, args) -> int:
    """The product's MLFQ with one knob of the idle weighting moved, or other seeds: against plain LAS."""
    base = MlfqConfig()
    variants = [(f"idle_weight={w}", replace(base, idle_weight=w), args.seed) for w in (0.1, 0.5)]
    variants += [(f"idle_util={u}", replace(base, idle_util=u), args.seed) for u in (0.1, 0.5)]
    variants += [(f"seed={s}", base, s) for s in (args.seed + 1, args.seed + 2)]
    unfinished = 0
    for name, config, seed in variants:
        jobs = window if seed == args.seed else attach(window, distribution, seed=seed)
        result = simulate(jobs, uniform_nodes(args.gpus), policy="mlfq", config=config)
        unfinished += result.jobs - result.finished
        mine, theirs = averages(result, jobs, args.low), averages(las, jobs, args.low)
        ratios = {f"{g}_vs_las": round(mine[g] / theirs[g], 3) if mine[g] and theirs[g] else None for g in mine}
        # And the jobs this variant treats as idle (below its own idle_util).
        idle, idle_las = averages(result, jobs, config.idle_util)["low"], averages(las, jobs, config.idle_util)["low"]
        ratios["idle_vs_las"] = round(idle / idle_las, 3) if idle and idle_las else None
        print(json.dumps({"variant": name, **ratios, "avg_jct_s": mine}), flush=True)
    return unfinished


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start-day", type=float, default=28)
    parser.add_argument("--days", type=float, default=7)
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0, help="seed of the utilization drawn for each job")
    parser.add_argument("--low", type=float, default=0.30, help="below this utilization a job counts as low")
    parser.add_argument("--rollups", metavar="DATABASE_URL", help="replay the utilization its rollups measured")
    parser.add_argument("--sweep", action="store_true", help="also move each knob of the idle weighting")
    parser.add_argument("--quick", action="store_true", help="one day on 64 GPUs (a smoke run)")
    args = parser.parse_args()
    distribution = rollup_distribution(args.rollups) if args.rollups else PAI_2020
    if args.quick:
        args.days, args.gpus = 1, 64
    jobs = [j for j in read_jobs(TRACE, min_duration=60, max_gpus=8) if j.duration * j.gpu_count < 1000 * 3600]
    begin = args.start_day * 86400
    window = attach([j for j in jobs if begin <= j.submit < begin + args.days * 86400], distribution, seed=args.seed)
    load = sum(j.duration * j.gpu_count for j in window) / (args.gpus * args.days * 86400)
    errors = 0
    jct, results = {}, {}
    for name, (policy, config) in POLICIES.items():
        started = time.perf_counter()
        result = results[name] = simulate(window, uniform_nodes(args.gpus), policy=policy, config=config)
        errors += result.jobs - result.finished
        jct[name] = averages(result, window, args.low)
        line = {"discipline": name, **result.summary(), "avg_jct_s": jct[name]}
        print(json.dumps(line | {"seconds": round(time.perf_counter() - started, 1)}), flush=True)
    if args.sweep:
        errors += sweep(window, distribution, results["las"], args)

    def ratio(a, b, group):
        return round(jct[a][group] / jct[b][group], 3) if jct[a][group] and jct[b][group] else None

    low_jobs = sum(j.utilization < args.low for j in window)
    summary = {
        "jobs": len(window),
        "low_jobs": low_jobs,
        "low_work_share": round(
            sum(j.duration * j.gpu_count for j in window if j.utilization < args.low)
            / max(sum(j.duration * j.gpu_count for j in window), 1),
            3,
        ),
        "gpus": args.gpus,
        "offered_load": round(load, 2),
        "distribution": distribution.name,
        "distribution_mean": round(distribution.mean(), 3),
        "seed": args.seed,
        "avg_jct_s": jct,
        "mlfq_low_vs_las": ratio("mlfq", "las", "low"),
        "mlfq_all_vs_las": ratio("mlfq", "las", "all"),
        "mlfq_high_vs_las": ratio("mlfq", "las", "high"),
        "mlfq_low_vs_no_idle": ratio("mlfq", "mlfq_no_idle", "low"),
        "mlfq_all_vs_no_idle": ratio("mlfq", "mlfq_no_idle", "all"),
        "mlfq_low_vs_fifo": ratio("mlfq", "fifo", "low"),
    }
    summary["target_met"] = bool(
        summary["mlfq_low_vs_las"] is not None and summary["mlfq_low_vs_las"] < 1 and summary["mlfq_all_vs_las"] <= 1.05
    )
    print(json.dumps(summary | {"errors": errors, "commit": _setup.commit()}))


if __name__ == "__main__":
    main()
