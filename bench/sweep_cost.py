"""A 32-task sweep on spot against on-demand, on a cluster busy with a Philly-like background load.

The same policy code as live (``scheduler.policy.decide`` through ``scheduler.sim``): the sweep is
one group of 32 one-card tasks, at most ``--max-running`` at once; background jobs are the Microsoft
Philly trace (Jeon et al., ATC'19; jobs of at least 60 s, at most 8 GPUs, under 1,000 GPU-hours) of
a window of ``--days`` days, on a cluster sized so the background offers ``--load`` of its capacity.
The sweep is submitted ``--warmup-h`` hours into the window (the trace starts from an empty
cluster; by hour 38 it is full and work queues), once per ``--repeat`` at submit times
``--every-h`` apart; each run is simulated three times: tasks on spot, on spot with the
on-demand fallback (more than ``--max-preemptions`` preemptions), and on-demand.

Money comes from the product's own rating rules (``billing.rating``: per second, a minute's minimum
per run, spot at the price in force): the demo rate card's RTX 3090 (1.58 CNY per card-hour
on-demand; spot = on-demand x (0.33 + (0.70 - 0.33) x load), recomputed every 300 s from the
simulated cluster's load, recorded when it moves by a cent, as ``billing.prices``). A preempted task
keeps its cards (and pays) through the grace period while it checkpoints, and every start holds its
card ``--launch-s`` before its own time runs (start-up and loading the checkpoint).

Prints one JSON line per submit time, then the summary line:
{"tasks", "spot_cost", "ondemand_cost", "cost_ratio", "spot_makespan_s", "ondemand_makespan_s",
 "preemptions", ...} (means over the submit times).

    python bench/sweep_cost.py [--tasks 32] [--task-h 1] [--max-running 8] [--load 1.0] [--repeat 5]
"""

import argparse
import json
import statistics
import time
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

import _setup

from billing.rating import Rate, Shape, Timeline, charge_lines
from scheduler.sim.simulator import simulate, uniform_nodes
from scheduler.sim.traces import TraceJob, read_jobs

TRACE = _setup.TRACES / "philly.csv"
CARD_HOUR = Decimal("1.58")  # the demo catalog's RTX 3090, on-demand
FLOOR, CEILING = Decimal("0.33"), Decimal("0.70")  # the rate card's default spot band
SPOT_PRICE_S = 300
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
SWEEP_ID = 10**9  # ids of the sweep's tasks start here (the trace's are row numbers)


def spot_prices(timeline: list[tuple[float, int, float]]) -> list[tuple[datetime, Decimal]]:
    """Spot prices as billing.prices records them: every SPOT_PRICE_S from the load, when they move a cent."""
    prices: list[tuple[datetime, Decimal]] = []
    next_at = -float("inf")
    for t, _, load in timeline:
        if t < next_at:
            continue
        next_at = t + SPOT_PRICE_S
        factor = FLOOR + (CEILING - FLOOR) * Decimal(str(round(min(max(load, 0.0), 1.0), 4)))
        price = (CARD_HOUR * factor).quantize(Decimal("0.0001"), rounding=ROUND_HALF_UP)
        if not prices or abs(price - prices[-1][1]) >= Decimal("0.01"):
            prices.append((EPOCH + timedelta(seconds=t), price))
    return prices


def sweep_cost(result, task_ids: list[int], timeline: Timeline) -> Decimal:
    """What the sweep's runs are charged, run by run, by the product's rating rules."""
    total = Decimal(0)
    for task in task_ids:
        for start, end, spot in result.runs.get(task, []):
            lines, _ = charge_lines(
                Shape("RTX3090", 1, 1000, 8, 32 * 1024, spot=spot),
                started_at=EPOCH + timedelta(seconds=start),
                ended_at=EPOCH + timedelta(seconds=end),
                settled_until=None,
                settle_to=EPOCH + timedelta(seconds=end),
                timeline=timeline,
            )
            total += sum((line.amount for line in lines), Decimal(0))
    return total


def run(background, gpus, submit, args, *, spot: bool, fallback_after: int | None) -> dict:
    sweep = [
        TraceJob(
            SWEEP_ID + i,
            submit,
            args.task_h * 3600,
            1,
            user="sweep",
            spot=spot,
            group="sweep",
            group_cap=args.max_running,
            fallback_after=fallback_after,
        )
        for i in range(args.tasks)
    ]
    result = simulate(
        [*background, *sweep],
        uniform_nodes(gpus),
        policy="mlfq",
        grace=args.grace_s,
        launch_overhead=args.launch_s,
        timeline_every=60,
    )
    ids = [t.id for t in sweep]
    timeline = Timeline([Rate(None, EPOCH - timedelta(days=1), CARD_HOUR)], spot_prices(result.timeline))
    runs = [r for i in ids for r in result.runs.get(i, [])]
    return {
        "cost": sweep_cost(result, ids, timeline),
        "makespan_s": max(result.done[i] for i in ids) - submit,
        "preemptions": sum(result.preempted[i] for i in ids),
        "spot_hours": sum(end - start for start, end, on_spot in runs if on_spot) / 3600,
        "ondemand_hours": sum(end - start for start, end, on_spot in runs if not on_spot) / 3600,
        "mean_spot_price": (float(statistics.fmean(float(p) for _, p in timeline.spot)) if timeline.spot else None),
        "background_avg_jct_s": statistics.fmean(
            result.done[j.id] - j.submit for j in background if j.id in result.done
        ),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--task-h", type=float, default=1.0, help="each task's own running time")
    parser.add_argument("--max-running", type=int, default=8)
    parser.add_argument("--max-preemptions", type=int, default=3)
    parser.add_argument("--load", type=float, default=1.0, help="background GPU-hours / cluster GPU-hours")
    parser.add_argument("--start-day", type=float, default=28)
    parser.add_argument("--days", type=float, default=3)
    parser.add_argument("--warmup-h", type=float, default=38)
    parser.add_argument("--every-h", type=float, default=6)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--grace-s", type=float, default=30, help="PREEMPTION_GRACE_S")
    parser.add_argument("--launch-s", type=float, default=30, help="each start: container, loading the checkpoint")
    args = _setup.parse(parser, tasks=4, days=1, warmup_h=2, repeat=1)

    jobs = [j for j in read_jobs(TRACE, min_duration=60, max_gpus=8) if j.duration * j.gpu_count < 1000 * 3600]
    begin = args.start_day * 86400
    background = [j for j in jobs if begin <= j.submit < begin + args.days * 86400]
    gpu_seconds = sum(j.duration * j.gpu_count for j in background)
    gpus = max(8, round(gpu_seconds / (args.days * 86400 * args.load) / 8) * 8)
    started = time.perf_counter()
    rows = []
    for k in range(args.repeat):
        submit = begin + (args.warmup_h + k * args.every_h) * 3600
        spot = run(background, gpus, submit, args, spot=True, fallback_after=None)
        fallback = run(background, gpus, submit, args, spot=True, fallback_after=args.max_preemptions)
        ondemand = run(background, gpus, submit, args, spot=False, fallback_after=None)
        row = {
            "submit_h": round(submit / 3600 - args.start_day * 24, 1),
            "spot_cost": float(spot["cost"]),
            "fallback_cost": float(fallback["cost"]),
            "ondemand_cost": float(ondemand["cost"]),
            "spot_makespan_s": round(spot["makespan_s"]),
            "fallback_makespan_s": round(fallback["makespan_s"]),
            "ondemand_makespan_s": round(ondemand["makespan_s"]),
            "spot_preemptions": spot["preemptions"],
            "fallback_preemptions": fallback["preemptions"],
            "ondemand_preemptions": ondemand["preemptions"],
            "fallback_ondemand_hours": round(fallback["ondemand_hours"], 2),
            "mean_spot_card_hour": round(spot["mean_spot_price"], 3) if spot["mean_spot_price"] else None,
            "background_avg_jct_s": {
                "with_spot_sweep": round(spot["background_avg_jct_s"]),
                "with_ondemand_sweep": round(ondemand["background_avg_jct_s"]),
            },
        }
        rows.append(row)
        print(json.dumps(row), flush=True)

    def mean(key):
        return statistics.fmean(r[key] for r in rows)

    spot_cost, ondemand_cost = mean("spot_cost"), mean("ondemand_cost")
    _setup.report(
        {
            "tasks": args.tasks,
            "spot_cost": round(spot_cost, 2),
            "ondemand_cost": round(ondemand_cost, 2),
            "cost_ratio": round(spot_cost / ondemand_cost, 3),
            "spot_makespan_s": round(mean("spot_makespan_s")),
            "ondemand_makespan_s": round(mean("ondemand_makespan_s")),
            "preemptions": round(mean("spot_preemptions"), 1),
            "ondemand_preemptions": round(mean("ondemand_preemptions"), 1),
            "fallback_cost": round(mean("fallback_cost"), 2),
            "fallback_makespan_s": round(mean("fallback_makespan_s")),
            "fallback_preemptions": round(mean("fallback_preemptions"), 1),
            "currency": "CNY",
            "task_h": args.task_h,
            "max_running": args.max_running,
            "gpus": gpus,
            "background_jobs": len(background),
            "background_load": args.load,
            "submit_times": args.repeat,
            "seconds": round(time.perf_counter() - started, 1),
        },
        errors=0,
    )


if __name__ == "__main__":
    main()
