"""GPU allocation on the Alibaba openb pod list, FGD paper method (Weng et al., ATC'23).

Arrivals as in the paper's artifact (kubernetes-scheduler-simulator, "tune
1.3"): every pod of the list once, in a random order, then pods drawn at random
(with replacement) until the GPU requested reaches 130% of the 6,212-GPU
cluster; nothing departs; a pod that fits on no node fails; CPU and memory
count. Reported: share of GPU capacity allocated at the end, mean over seeds,
for random, best-fit and our placement (FGD with the trace's task mix, best
fit among near-equal candidates), all in this same harness.

Seeds 0-9 are the ones FGD's tie-break was tuned on, so the default run takes
seeds 10-19 (``--first-seed``) and reports ours' margin over best-fit on the
same arrivals, seed by seed: its median, smallest and largest.

    python bench/fgd_allocation.py [--seeds 10] [--first-seed 10] [--jobs 2]
"""

import argparse
import collections
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

import _setup
import numpy as np

from scheduler.policy.cluster import ClusterState
from scheduler.policy.placement import Request, choose, task_mix
from scheduler.sim.traces import read_openb_nodes, read_openb_pods

POD_FILE = _setup.TRACES / "openb_pod_list_default.csv"
NODE_FILE = _setup.TRACES / "openb_node_list_gpu_node.csv"
POLICIES = {"random": "random", "bestfit": "bestfit", "ours": "fgd"}


def requested_milli(pod) -> int:
    return pod.gpu_count * pod.gpu_milli


def arrivals(pods, rng, target_milli: float) -> list:
    """The whole list shuffled, then random draws while the GPU requested stays within the target."""
    order = [pods[i] for i in rng.permutation(len(pods))]
    requested = sum(requested_milli(p) for p in order)
    while True:
        pod = pods[rng.integers(len(pods))]
        if requested + requested_milli(pod) > target_milli:
            return order
        order.append(pod)
        requested += requested_milli(pod)


def run(policy: str, seed: int, inflation: float = 1.3) -> dict:
    pods, nodes = read_openb_pods(POD_FILE), read_openb_nodes(NODE_FILE)
    mix = task_mix((p.gpu_count, p.gpu_milli, p.cpu, p.memory_mb) for p in pods)
    rng = np.random.default_rng(seed)
    # The paper's method: fractions of any size share a card (free-form). The product's rule, one share
    # size per card, is measured against this anchor in bench/share_classes.py.
    cluster = ClusterState(nodes, one_size_per_card=False)
    placed = failed = 0
    started = time.perf_counter()
    for pod in arrivals(pods, rng, inflation * cluster.total_cards * 1000):
        milli = pod.gpu_milli if pod.gpu_count else 0
        request = Request(pod.id, None, pod.gpu_count, milli, pod.cpu, pod.memory_mb)
        choice = choose(cluster, request, POLICIES[policy], mix=mix, rng=rng)
        if choice is None:
            failed += 1
            continue
        cluster.take(choice.node, choice.cards, milli, pod.cpu, pod.memory_mb)
        placed += 1
    return {
        "policy": policy,
        "seed": seed,
        "allocation_pct": round(100 * cluster.allocated_share(), 3),
        "placed": placed,
        "failed": failed,
        "seconds": round(time.perf_counter() - started, 1),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--first-seed", type=int, default=10, help="seeds 0-9 were used for tuning")
    args = _setup.parse(parser, seeds=1)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    runs = [(policy, seed) for policy in POLICIES for seed in seeds]
    results = collections.defaultdict(dict)
    with ProcessPoolExecutor(args.jobs) as pool:
        for result in pool.map(run, *zip(*runs, strict=True)):
            print(json.dumps(result), flush=True)
            results[result["policy"]][result["seed"]] = result["allocation_pct"]
    mean = {policy: round(statistics.fmean(v.values()), 2) for policy, v in results.items()}
    margins = sorted(results["ours"][seed] - results["bestfit"][seed] for seed in seeds)
    _setup.report(
        {
            "allocation_pct": mean["ours"],
            "bestfit_pct": mean["bestfit"],
            "random_pct": mean["random"],
            "margin_vs_bestfit_pp": round(statistics.median(margins), 2),
            "margin_min_pp": round(margins[0], 2),
            "margin_max_pp": round(margins[-1], 2),
            "seeds": f"{seeds.start}-{seeds.stop - 1}",
            "published": {"random": 87.5, "bestfit": 93.1, "fgd": 95.4},
        },
        errors=0,
    )


if __name__ == "__main__":
    main()
