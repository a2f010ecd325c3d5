"""What tenants' disks hold on each node, summed over a history of ended and released workloads: the same sums
with and without the history, in the same run.

``selectors.disk_held`` runs at every tick (every node) and at every batch of placements (the batch's nodes): it
sums the disks of every workload not released. Released workloads are never deleted, so a cluster's workload table
grows all its life, and ended jobs keep their disks ``HOUSEKEEPING_DAYS`` (5,000 jobs a day for 15 days is 75,000);
the sums must not grow with either (on PostgreSQL every workload's disks are kept per node by a trigger,
``DiskDelta``: scheduler migration 0030, after 0027's partial index and 0028's ended jobs' deltas).

Set up (not timed) on its own PostgreSQL database: ``--nodes`` nodes and ``--live`` running workloads, spread over
the nodes, each row a copy of one workload made through the ORM. Timed: the sum over every node and over ``--batch``
nodes, the median of ``--calls`` calls each; again once ``--ended`` ended jobs whose disks are kept are added (their
deltas folded, as the reconciliation beat does), and again once ``--released`` released workloads are added. Each
phase ends with ``VACUUM ANALYZE``, as autovacuum would. Errors: sums that differ with the released history
(released work holds no disk).

    python bench/disk_history.py [--nodes 1000] [--live 5000] [--ended 25000] [--released 300000]

Ends with {"every_node_live_ms", "every_node_ms", "every_node_ended_ratio", "every_node_history_ms",
"every_node_ratio", and the same for a batch's nodes, ...}; target: every ratio <= 1.5 (the sums cost what the
running work costs).
"""

import argparse
import os
import random
import statistics
import time

import _setup
from tick_latency import cluster_create, queue_add, users_create

DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpucloud_bench_disk")


def copies(count: int, status: str, first: int) -> None:
    """``count`` copies of the template workload with ``status``, on nodes taken in turn (uids from ``first``)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT string_agg(column_name, ', ') FROM information_schema.columns WHERE table_name = "
            "'scheduler_workload' AND column_name NOT IN ('id', 'uid', 'status', 'node_id', 'kind')"
        )
        columns = cursor.fetchone()[0]
        cursor.execute(
            f"INSERT INTO scheduler_workload (uid, status, node_id, kind, {columns}) "
            f"SELECT 'h' || (%s + g)::text, %s, n.ids[1 + g %% array_length(n.ids, 1)], 'job', {columns} "
            "FROM scheduler_workload w, generate_series(1, %s) g, "
            "(SELECT array_agg(id ORDER BY id) AS ids FROM scheduler_node) n "
            "WHERE w.id = (SELECT min(id) FROM scheduler_workload)",
            [first, status, count],
        )
        cursor.execute("VACUUM ANALYZE scheduler_workload")


def timed(calls: int, read) -> tuple[float, dict]:
    """Median milliseconds of ``calls`` calls of ``read``, and what it returned."""
    seconds = []
    for _ in range(calls):
        started = time.perf_counter()
        result = read()
        seconds.append(time.perf_counter() - started)
    return round(1000 * statistics.median(seconds), 2), result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--live", type=int, default=5_000, help="running workloads")
    parser.add_argument("--ended", type=int, default=25_000, help="ended jobs whose disks are kept")
    parser.add_argument("--released", type=int, default=300_000, help="the history: released workloads")
    parser.add_argument("--batch", type=int, default=190, help="nodes of one batch of placements")
    parser.add_argument("--calls", type=int, default=15)
    args = _setup.parse(parser, nodes=100, live=500, ended=2_000, released=20_000, batch=20, calls=5)
    _setup.fresh_database(DATABASE_URL)

    from django.db import connection

    from scheduler.models import Node
    from scheduler.selectors import disk_held
    from scheduler.services.cluster import disk_delta_fold

    def folded() -> None:  # as the control plane's reconciliation beat does (every RECONCILE_S), then autovacuum
        disk_delta_fold()
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE scheduler_diskdelta")

    cluster_create(args.nodes)
    queue_add(1, users_create(1), random.Random(1), [(1, 1000)])  # the template every row copies
    batch = list(Node.objects.order_by("?").values_list("pk", flat=True)[: args.batch])
    copies(args.live, "running", 0)
    folded()
    live, _ = timed(args.calls, disk_held)
    some_live, _ = timed(args.calls, lambda: disk_held(batch))
    copies(args.ended, "succeeded", args.live)
    folded()
    every, every_held = timed(args.calls, disk_held)
    some, some_held = timed(args.calls, lambda: disk_held(batch))
    copies(args.released, "released", args.live + args.ended)
    every_history, every_held_history = timed(args.calls, disk_held)
    some_history, some_held_history = timed(args.calls, lambda: disk_held(batch))
    errors = (every_held != every_held_history) + (some_held != some_held_history)
    _setup.report(
        {
            "nodes": args.nodes,
            "live": args.live,
            "ended": args.ended,
            "released": args.released,
            "every_node_live_ms": live,
            "every_node_ms": every,
            "every_node_ended_ratio": round(every / live, 2),
            "every_node_history_ms": every_history,
            "every_node_ratio": round(every_history / every, 2),
            "batch_nodes": len(batch),
            "batch_live_ms": some_live,
            "batch_ms": some,
            "batch_ended_ratio": round(some / some_live, 2),
            "batch_history_ms": some_history,
            "batch_ratio": round(some_history / some, 2),
        },
        errors=errors,
    )


if __name__ == "__main__":
    main()
