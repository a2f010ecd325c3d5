"""What one share size per card costs, per set of offered sizes, against free-form fractions in the same run.

A card's fraction is enforced by its MPS daemon, whose limits are per card, so a card serves one share
size at a time (``scheduler.policy.cluster``) and the product offers a few sizes (``SHARE_SIZES``); a
request between two sizes rounds UP to the next (above the largest: a whole card). Each variant below
is measured against the anchor, ``free-form``: the trace's exact thousandths, any sizes on one card
(the policy before the rule), on the same arrivals.

- ``exact``: the rule alone (exact thousandths, one size per card), to tell its cost from rounding's.
- ``grid-0.1``: the 0.1 .. 0.9 grid the portal offered before, rounded up, with the rule.
- the candidate sets (thousandths; each size fills a card exactly), the product's marked ``chosen``.

1. openb (Alibaba PAI, Weng et al., ATC'23), bench/fgd_allocation.py's method: every pod once in a
   random order, then random draws until 130 % of the cluster's GPUs are asked for; nothing departs.
   Per seed and variant: ``asked_pct``, the share of GPU capacity the placed pods asked for (exact
   thousandths: the work served); ``allocated_pct``, the share held (rounding up included); both again
   when the first GPU pod found no room (``first_failure_*``); ``frag_cards``, FGD's expected
   fragmentation at the end for the variant's own mix; ``failed_gpu_pods``. FGD (the product's
   placement) and best fit.
2. Philly (Jeon et al., ATC'19) with fractions: Philly's jobs ask for whole cards only, so on it alone
   the rule changes nothing. Each 1-card job of a window instead asks for a share drawn (seeded) from
   openb's 1-card requests (44 % of them fractions); multi-card jobs stay whole. The cluster is sized,
   as in bench/philly_jct.py, for an offered load of the exact shares; MLFQ with FGD. Per window, seed
   and variant: average JCT, average queueing (submit to first start), and both for the fractional
   jobs alone.

Ratios are variant / free-form on the same seed (and window); the summary gives their median, smallest
and largest over seeds. One JSON line per run, one per variant, then the summary.

    python bench/share_classes.py [--seeds 10] [--first-seed 10] [--philly-seeds 3] [--jobs 2] [--quick]
"""

import argparse
import json
import math
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import _setup
import fgd_allocation
import numpy as np

from scheduler.policy.cluster import SHARE_SIZES, WHOLE_CARD, ClusterState, round_up_share
from scheduler.policy.placement import Request, choose, fragmentation, task_mix
from scheduler.sim.simulator import simulate, uniform_nodes
from scheduler.sim.traces import read_jobs, read_openb_nodes, read_openb_pods

PHILLY = _setup.TRACES / "philly.csv"
ANCHOR = "free-form"
# name -> (offered sizes, None: the trace's exact thousandths; one size per card)
VARIANTS = {
    ANCHOR: (None, False),
    "exact": (None, True),
    "grid-0.1": (tuple(range(100, WHOLE_CARD, 100)), True),
    "100-200-500": ((100, 200, 500), True),
    "250-500": ((250, 500), True),
    "100-250-500": ((100, 250, 500), True),
    "125-250-500": ((125, 250, 500), True),
}
CHOSEN = "-".join(str(size) for size in SHARE_SIZES)
QUICK_VARIANTS = [ANCHOR, "exact", CHOSEN]
# (name, first day, days, target offered load of the exact shares)
WINDOWS = [("d28", 28, 2, 1.3), ("d49", 49, 1.5, 1.5), ("d70", 70, 2, 1.6)]
QUICK_WINDOWS = [("d87-quick", 87, 1, 1.5)]
PER_NODE = 8

_DATA = {}  # the traces, read once before the workers fork


def load() -> None:
    _DATA["pods"] = read_openb_pods(fgd_allocation.POD_FILE)
    _DATA["nodes"] = read_openb_nodes(fgd_allocation.NODE_FILE)
    _DATA["philly"] = read_jobs(PHILLY)


def share(milli: int, sizes) -> int:
    """The share held for a 1-card request of ``milli``: rounded up to an offered size (None: as asked)."""
    return milli if sizes is None else round_up_share(milli, sizes)


def openb_run(task: tuple) -> dict:
    variant, strategy, seed = task
    sizes, rule = VARIANTS[variant]
    pods = _DATA["pods"]

    def held(pod) -> int:
        return share(pod.gpu_milli, sizes) if pod.gpu_count == 1 else pod.gpu_milli

    mix = task_mix((p.gpu_count, held(p), p.cpu, p.memory_mb) for p in pods)
    rng = np.random.default_rng(seed)
    cluster = ClusterState(_DATA["nodes"], one_size_per_card=rule)
    capacity = cluster.total_cards * WHOLE_CARD
    asked = failed = 0
    first_failure = None  # (asked, allocated) when the first GPU pod found no room
    started = time.perf_counter()
    for pod in fgd_allocation.arrivals(pods, rng, 1.3 * capacity):
        milli = held(pod) if pod.gpu_count else 0
        choice = choose(cluster, Request(pod.id, None, pod.gpu_count, milli, pod.cpu, pod.memory_mb), strategy, mix=mix)
        if choice is None:
            if pod.gpu_count:
                failed += 1
                first_failure = first_failure or (asked / capacity, cluster.allocated_share())
            continue
        cluster.take(choice.node, choice.cards, milli, pod.cpu, pod.memory_mb)
        asked += pod.gpu_count * pod.gpu_milli
    asked_then, held_then = first_failure or (asked / capacity, cluster.allocated_share())
    return {
        "trace": "openb",
        "variant": variant,
        "strategy": strategy,
        "seed": seed,
        "asked_pct": round(100 * asked / capacity, 3),
        "allocated_pct": round(100 * cluster.allocated_share(), 3),
        "first_failure_asked_pct": round(100 * asked_then, 3),
        "first_failure_allocated_pct": round(100 * held_then, 3),
        "frag_cards": round(fragmentation(cluster, mix), 1),
        "failed_gpu_pods": failed,
        "seconds": round(time.perf_counter() - started, 1),
    }


def philly_window(start_day: float, days: float, load: float, seed: int):
    """The window's jobs, each 1-card job asking for a share drawn from openb's 1-card requests, and a
    cluster sized for ``load`` of their exact shares (at least 4 nodes, and as wide as the widest job)."""
    begin, end = start_day * 86400, (start_day + days) * 86400
    jobs = [j for j in _DATA["philly"] if begin <= j.submit < end]
    shares = np.array([p.gpu_milli for p in _DATA["pods"] if p.gpu_count == 1])
    rng = np.random.default_rng(seed)
    jobs = [replace(j, gpu_milli=int(rng.choice(shares))) if j.gpu_count == 1 else j for j in jobs]
    work = sum(min(j.duration, end - j.submit) * j.gpu_count * j.gpu_milli / WHOLE_CARD for j in jobs)
    widest = max(j.gpu_count for j in jobs)
    nodes = max(math.ceil(work / (load * days * 86400) / PER_NODE), 4, math.ceil(widest / PER_NODE))
    return jobs, nodes * PER_NODE, round(work / (nodes * PER_NODE * days * 86400), 2)


def philly_run(task: tuple) -> dict:
    (name, start_day, days, load), variant, seed = task
    sizes, rule = VARIANTS[variant]
    jobs, gpus, offered = philly_window(start_day, days, load, seed)
    started = time.perf_counter()
    result = simulate(
        jobs, uniform_nodes(gpus, PER_NODE), policy="mlfq", strategy="fgd", share_sizes=sizes, one_size_per_card=rule
    )
    fractional = [j for j in jobs if j.gpu_milli < WHOLE_CARD]

    def mean(values) -> float | None:
        return round(float(np.mean(values))) if values else None

    return {
        "trace": "philly",
        "window": name,
        "variant": variant,
        "seed": seed,
        "jobs": len(jobs),
        "finished": result.finished,
        "fractional_jobs": len(fractional),
        "gpus": gpus,
        "offered_load": offered,
        "avg_jct_s": round(result.avg_jct),
        "avg_queueing_s": round(result.avg_queueing),
        "fractional_avg_jct_s": mean([result.done[j.id] - j.submit for j in fractional if j.id in result.done]),
        "fractional_avg_queueing_s": mean(
            [result.first_start[j.id] - j.submit for j in fractional if j.id in result.first_start]
        ),
        "gpu_allocation_pct": round(result.gpu_allocation_pct, 1),
        "seconds": round(time.perf_counter() - started, 1),
    }


def spread(ratios: list[float]) -> dict | None:
    """Median, smallest and largest of per-seed ratios to the anchor (None: none measured)."""
    ratios = sorted(ratios)
    if not ratios:
        return None
    return {"median": round(statistics.median(ratios), 4), "min": round(ratios[0], 4), "max": round(ratios[-1], 4)}


def ratios(rows: list[dict], variant: str, metric: str, key: tuple) -> list[float]:
    """``metric`` of ``variant`` over the anchor's, run by run (runs matched on ``key``; where the anchor's
    is 0 or unknown, as a window's fractional jobs that never queued, there is no ratio)."""
    anchor = {tuple(r[k] for k in key): r[metric] for r in rows if r["variant"] == ANCHOR}
    pairs = [(r[metric], anchor[tuple(r[k] for k in key)]) for r in rows if r["variant"] == variant]
    return [mine / theirs for mine, theirs in pairs if mine is not None and theirs]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="openb seeds")
    parser.add_argument("--first-seed", type=int, default=10, help="openb: seeds 0-9 tuned FGD (fgd_allocation.py)")
    parser.add_argument("--philly-seeds", type=int, default=3, help="draws of the shares of Philly's 1-card jobs")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (processes)")
    args = _setup.parse(parser, seeds=1, philly_seeds=1)
    began = time.perf_counter()
    variants = QUICK_VARIANTS if args.quick else list(VARIANTS)
    strategies = ("fgd",) if args.quick else ("fgd", "bestfit")
    windows = QUICK_WINDOWS if args.quick else WINDOWS
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    load()
    errors = 0
    with ProcessPoolExecutor(args.jobs) as pool:
        openb_tasks = [(v, s, seed) for s in strategies for seed in seeds for v in variants]
        openb = []
        for row in pool.map(openb_run, openb_tasks):
            print(json.dumps(row), flush=True)
            openb.append(row)
        philly_tasks = [(w, v, seed) for w in windows for seed in range(args.philly_seeds) for v in variants]
        philly = []
        for row in pool.map(philly_run, philly_tasks):
            errors += row["jobs"] - row["finished"]
            print(json.dumps(row), flush=True)
            philly.append(row)
    summary = {}
    for variant in variants:
        sizes, rule = VARIANTS[variant]
        line = {"variant": variant, "sizes": sizes, "one_size_per_card": rule}
        for strategy in strategies:
            rows = [r for r in openb if r["strategy"] == strategy]
            mine = [r for r in rows if r["variant"] == variant]
            line[f"openb_{strategy}"] = {
                **{m: round(statistics.fmean(r[m] for r in mine), 2) for m in ("asked_pct", "allocated_pct")},
                **{
                    m: round(statistics.fmean(r[m] for r in mine), 2)
                    for m in ("first_failure_asked_pct", "first_failure_allocated_pct")
                },
                "frag_cards": round(statistics.fmean(r["frag_cards"] for r in mine), 1),
                "asked_vs_free": spread(ratios(rows, variant, "asked_pct", ("seed",))),
                "first_failure_asked_vs_free": spread(ratios(rows, variant, "first_failure_asked_pct", ("seed",))),
            }
        key = ("window", "seed")
        line["philly"] = {
            "avg_jct_vs_free": spread(ratios(philly, variant, "avg_jct_s", key)),
            "avg_queueing_vs_free": spread(ratios(philly, variant, "avg_queueing_s", key)),
            "fractional_avg_jct_vs_free": spread(ratios(philly, variant, "fractional_avg_jct_s", key)),
            "fractional_avg_queueing_vs_free": spread(ratios(philly, variant, "fractional_avg_queueing_s", key)),
        }
        print(json.dumps(line), flush=True)
        summary[variant] = line
    chosen = summary[CHOSEN]
    _setup.report(
        {
            "bench": "share_classes",
            "chosen": list(SHARE_SIZES),
            "openb_fgd_asked_vs_free": chosen["openb_fgd"]["asked_vs_free"],
            "openb_fgd_first_failure_asked_vs_free": chosen["openb_fgd"]["first_failure_asked_vs_free"],
            "philly_avg_jct_vs_free": chosen["philly"]["avg_jct_vs_free"],
            "philly_fractional_avg_queueing_vs_free": chosen["philly"]["fractional_avg_queueing_vs_free"],
            "openb_seeds": f"{seeds.start}-{seeds.stop - 1}",
            "philly_windows": [w[0] for w in windows],
            "philly_seeds": args.philly_seeds,
            "seconds": round(time.perf_counter() - began),
        },
        errors=errors,
    )


if __name__ == "__main__":
    main()
