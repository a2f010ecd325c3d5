"""The live tick's cold fill on PostgreSQL: 10,000 queued requests placed on an empty 1,000 nodes x 8 GPUs.

One tick on an empty cluster (nothing runs, nothing departs): the largest
single batch of placements the tick ever commits. The steady state — work
running, arriving and leaving, tick after tick — is bench/tick_steady.py.
Unlike bench/scheduler_throughput.py (the pure policy), this runs
``scheduler.tick.schedule_tick`` against the database: it reads the queue and
the cluster, decides, and commits every allocation (row locks, re-checks,
events) and sends every launch message to its node's queue on Redis.

    python bench/tick_latency.py [--requests 10000] [--nodes 1000]

Uses its own PostgreSQL database (gpucloud_bench_tick, recreated) and Redis
database 14 (its node queues are deleted afterwards). Ends with
{"tick_ms", "placements_per_s", "queries_per_placement", "errors", "commit"}.
"""

import argparse
import os
import random
import time

import _setup

DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpucloud_bench_tick")
SHAPES = [(1, 1000), (1, 500), (1, 250), (1, 300), (1, 100), (1, 700), (2, 1000)]  # (cards, thousandths)


def setup_database():
    _setup.fresh_database(DATABASE_URL, SCHEDULER_QUEUE="bench-scheduler")


def populate(requests: int, nodes: int) -> None:
    cluster_create(nodes)
    queue_add(requests, users_create(50), random.Random(1), SHAPES)


def cluster_create(nodes: int) -> None:
    """``nodes`` simulated nodes of 8 A100-80GB cards, heartbeating."""
    from django.utils import timezone

    from scheduler.models import Gpu, Node

    now = timezone.now()
    Node.objects.bulk_create(
        # Disk offered as a host of 8 A100s with 16 TB registers it: counted at placement, as on real hosts.
        Node(name=f"n{i:04d}", cpu_cores=128, memory_mb=1 << 20, disk_gb=16000, simulated=True, last_heartbeat=now)
        for i in range(nodes)
    )
    Gpu.objects.bulk_create(
        Gpu(node=node, index=k, uuid=f"GPU-{node.name}-{k}", model="A100-80GB", memory_mb=81920)
        for node in Node.objects.all()
        for k in range(8)
    )


def users_create(count: int) -> list:
    from django.contrib.auth import get_user_model

    return [get_user_model().objects.create_user(f"u{i}") for i in range(count)]


def queue_add(requests: int, users: list, rng: random.Random, shapes: list[tuple[int, int]], first: int = 0) -> None:
    """Queue ``requests`` preemptible one-node jobs of the given (cards, thousandths) shapes, as submitted now."""
    from django.utils import timezone

    from scheduler.models import Workload, WorkloadStatus

    now = timezone.now()
    workloads = []
    for i in range(first, first + requests):
        cards, milli = rng.choice(shapes)
        workloads.append(
            Workload(
                owner=users[i % len(users)],
                kind="job",
                name=f"w{i}",
                image_ref="gpucloud/busybox-standin:latest",
                gpu_model="A100-80GB",
                gpu_count=cards,
                gpu_milli=milli,
                cpu_cores=1,
                memory_mb=1024,
                disk_gb=10,
                preemptible=True,
                status=WorkloadStatus.QUEUED,
                queued_at=now,
            )
        )
    Workload.objects.bulk_create(workloads, batch_size=2000)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    args = _setup.parse(parser, requests=500, nodes=50)
    setup_database()
    populate(args.requests, args.nodes)

    import redis
    from django.conf import settings
    from django.db import connection

    from scheduler.models import Node
    from scheduler.tick import schedule_tick

    queries = 0

    def count(execute, sql, params, many, context):
        nonlocal queries
        queries += 1
        return execute(sql, params, many, context)

    profile = os.environ.get("BENCH_PROFILE")
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    with connection.execute_wrapper(count):
        started = time.perf_counter()
        result = schedule_tick()
        seconds = time.perf_counter() - started
    if profile:
        profiler.disable()
        profiler.dump_stats(profile)
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(*[node.queue for node in Node.objects.all()], settings.SCHEDULER_QUEUE)
    placed = len(result.placed)
    _setup.report(
        {
            "requests": args.requests,
            "gpus": 8 * args.nodes,
            "placed": placed,
            "waiting": result.waiting,
            "tick_ms": round(1000 * seconds, 1),
            "placements_per_s": round(placed / seconds, 1),
            "queries_per_placement": round(queries / max(placed, 1), 2),
        },
        errors=0,
    )


if __name__ == "__main__":
    main()
