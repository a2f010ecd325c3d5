"""Replay a job trace through the scheduling policy and print one JSON line of results."""

import json
import sys
import time

from django.core.management.base import BaseCommand, CommandError

from scheduler.gpuspec import parse_sim_spec
from scheduler.policy import DISCIPLINES, STRATEGIES
from scheduler.policy.cluster import CardSpec, NodeSpec
from scheduler.sim.simulator import simulate, uniform_nodes
from scheduler.sim.traces import read_jobs


class Command(BaseCommand):
    help = (
        "Replay a trace (Philly, Alibaba openb pods, or CSV with submit_time,duration,num_gpus[,gpu_fraction]) "
        "through the same policy code as the live scheduler."
    )

    def add_arguments(self, parser):
        parser.add_argument("--trace", required=True)
        parser.add_argument("--policy", choices=sorted(DISCIPLINES), default="mlfq")
        parser.add_argument("--placement", choices=STRATEGIES, default="bestfit")
        size = parser.add_mutually_exclusive_group(required=True)
        size.add_argument("--gpus", type=int, help="cluster of N cards, 8 per node")
        size.add_argument(
            "--nodes",
            help="node spec, e.g. '16x8xV100' (16 nodes of 8 V100); groups separated by commas "
            "('2x4xRTX3090,1x4xA100-80GB')",
        )
        parser.add_argument("--whole-cards-only", action="store_true", help="round fractions up to whole cards")
        parser.add_argument("--start-day", type=float, default=0, help="window start, days after the first submit")
        parser.add_argument("--days", type=float, default=None, help="window length in days (default: all)")
        parser.add_argument("--min-duration", type=float, default=0)
        parser.add_argument("--quantum", type=float, default=300.0)
        parser.add_argument(
            "--launch-overhead",
            type=float,
            default=0.0,
            help="seconds a placed job holds its cards before it runs (a live launch and exit)",
        )
        parser.add_argument("--plot", help="write queue length and GPU allocation over time to this PNG")

    def handle(
        self,
        *args,
        trace,
        policy,
        placement,
        gpus,
        nodes,
        whole_cards_only,
        start_day,
        days,
        min_duration,
        quantum,
        launch_overhead,
        plot,
        **options,
    ):
        try:
            cluster = uniform_nodes(gpus) if gpus else _nodes(nodes)
            # Work wider than a node runs as a gang across nodes; only work wider than the whole cluster is dropped.
            total_cards = sum(len(n.cards) for n in cluster)
            jobs = read_jobs(trace, min_duration=min_duration, max_gpus=total_cards)
        except (OSError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        if days is not None or start_day:
            begin = start_day * 86400
            end = begin + days * 86400 if days is not None else float("inf")
            jobs = [j for j in jobs if begin <= j.submit < end]
        if not jobs:
            raise CommandError("no jobs in that trace window")
        started = time.perf_counter()

        def progress(done, total):
            self.stderr.write(f"\r{policy}: {done}/{total} jobs submitted", ending="")
            self.stderr.flush()

        result = simulate(
            jobs,
            cluster,
            policy=policy,
            strategy=placement,
            quantum=quantum,
            whole_cards_only=whole_cards_only,
            progress=progress if sys.stderr.isatty() else None,
            timeline_every=600 if plot else 0,
            launch_overhead=launch_overhead,
        )
        summary = result.summary() | {"seconds": round(time.perf_counter() - started, 1)}
        if plot:
            _plot(result, plot)
            summary["plot"] = plot
        self.stderr.write("")
        self.stdout.write(json.dumps(summary))


def _nodes(spec: str) -> list[NodeSpec]:
    nodes = []
    for group in spec.split(","):
        try:
            count, per_node, model = group.strip().split("x", 2)
            count, per_node = int(count), int(per_node)
            _, _, memory = parse_sim_spec(f"sim:1x{model}")[0]
        except Exception as exc:
            raise CommandError(
                f"--nodes expects <nodes>x<cards>x<MODEL>[,...] such as 16x8xV100, got {group!r}"
            ) from exc
        for _ in range(count):
            n = len(nodes)
            nodes.append(
                NodeSpec(f"node-{n}", 10**9, 10**9, [CardSpec((n, c), model, memory) for c in range(per_node)])
            )
    return nodes


def _plot(result, path: str) -> None:
    try:
        import matplotlib
    except ImportError as exc:
        raise CommandError("--plot needs matplotlib: pip install -r requirements-dev.txt") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = [(t - result.timeline[0][0]) / 3600 for t, _, _ in result.timeline]
    fig, (queue, alloc) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    queue.plot(hours, [q for _, q, _ in result.timeline])
    queue.set_ylabel("queued jobs")
    alloc.plot(hours, [100 * a for _, _, a in result.timeline], color="tab:green")
    alloc.set_ylabel("GPUs allocated (%)")
    alloc.set_xlabel("hours")
    fig.suptitle(f"{result.policy}: avg JCT {result.avg_jct:.0f} s, {result.jobs} jobs")
    fig.savefig(path, dpi=100)
