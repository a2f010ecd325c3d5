"""The live tick in steady state on PostgreSQL: ~5,000 running workloads on 1,000 nodes x 8 GPUs,
a queue of ~200, and work leaving and arriving between ticks.

bench/tick_latency.py measures one cold fill of an empty cluster; this measures the tick a busy
cluster runs all day. Set up (not timed): the nodes, then ``--running`` + ``--queue`` jobs (one to
four whole cards or a fraction, the mix filling the cards to ~95 %) placed by a first tick and
marked running, as their agents would. Then ``--ticks`` rounds of: every other round, what the
reconciliation beat does to the tick's reads (``reconcile_beat``, not timed); ``--churn`` running jobs end
(each through ``workload_transition`` to succeeded, as the agent reports an exit: the CAS, the
event, its shares given back), ``--churn`` new jobs are queued, and ``scheduler.tick.schedule_tick``
runs — timed — with the production settings: it reads the running and queued work, accrues
service, decides, commits every placement (row locks, re-checks, events) and sends the launches to
the nodes' queues on Redis. What it placed is then marked running.

    python bench/tick_steady.py [--nodes 1000] [--running 5000] [--queue 200] [--churn 200] [--ticks 30]
    python bench/tick_steady.py --against REV [--rounds 3] [--ticks 20]

``--against REV``: the same ticks in this tree and in commit REV (a git worktree), each on a fresh copy of
the one prepared database (for REV, with this tree's later migrations unapplied: its own tables and triggers),
interleaved (ABBA...) so the machine's drift falls on both; ends with both trees' medians and this tree's
ratios to REV's (``bench/_tick_rounds.py`` runs each side in its own tree).

Uses its own PostgreSQL database (BENCH_DATABASE_URL, default gpucloud_bench_steady, recreated) and Redis
database (BENCH_REDIS_URL, default database 14; its node queues are deleted afterwards). BENCH_PROFILE=FILE
writes cProfile's stats of the timed ticks to FILE. Errors: cards whose allocated share is not the sum of their
allocation rows, and running work that holds no card, at the end. Ends with {"tick_p50_ms",
"tick_p99_ms", "placements_per_s", "running", "queued", "errors", "commit"}; targets: p99 < 250 ms,
>= 1,000 committed placements/s.
"""

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

import _setup
from tick_latency import cluster_create, queue_add, users_create

DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpucloud_bench_steady")
# (cards, thousandths): 1.5 cards on average, so 5,000 running jobs hold ~95 % of 8,000 cards.
SHAPES = [(1, 1000), (1, 1000), (2, 1000), (2, 1000), (4, 1000), (1, 500), (1, 250), (1, 300)]


def running_mark(ids: list[int], rng: random.Random) -> None:
    """What the nodes' agents do once the containers run (their launch is not measured here)."""
    from datetime import timedelta

    from django.utils import timezone

    from scheduler.models import Workload, WorkloadStatus

    now = timezone.now()
    for workload_id in ids:
        Workload.objects.filter(pk=workload_id, status=WorkloadStatus.STARTING).update(
            status=WorkloadStatus.RUNNING, started_at=now - timedelta(seconds=rng.randrange(3600))
        )


def departures(count: int, rng: random.Random) -> None:
    from django.db.models.functions import Now

    from scheduler.models import Workload, WorkloadStatus
    from scheduler.services.lifecycle import workload_transition

    running = list(Workload.objects.filter(status=WorkloadStatus.RUNNING).values_list("pk", flat=True))
    for workload_id in rng.sample(running, min(count, len(running))):
        workload = Workload.objects.get(pk=workload_id)
        workload_transition(
            workload,
            to=WorkloadStatus.SUCCEEDED,
            allowed_from=[WorkloadStatus.RUNNING],
            reason="exited with status 0",
            finished_at=Now(),
        )


def reconcile_beat(number: int) -> None:
    """What the control plane's reconciliation beat does to what the tick reads, before tick ``number``: the beat
    runs every RECONCILE_S (10 s), the tick every SCHEDULER_TICK_S (5 s), so every other tick it folds the
    workloads' disk deltas (``disk_delta_fold``: one row per node once there are over two a node; without it the
    table grows by a row per placement and per end, which no running control plane lets happen)."""
    from django.conf import settings

    from scheduler.services.cluster import disk_delta_fold

    beat = settings.CELERY_BEAT_SCHEDULE
    every = beat["cluster-reconcile"]["schedule"] / beat["scheduler-tick"]["schedule"]
    if number % max(1, round(every)) == 0:
        disk_delta_fold()


ACCOUNTING_ERRORS = """
SELECT (SELECT count(*) FROM scheduler_gpu g
        WHERE g.allocated_milli <> COALESCE((SELECT sum(a.milli) FROM scheduler_allocation a WHERE a.gpu_id = g.id), 0))
     + (SELECT count(*) FROM scheduler_workload w
        WHERE w.status = 'running' AND NOT EXISTS (SELECT 1 FROM scheduler_allocation a WHERE a.workload_id = w.id))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--running", type=int, default=5_000)
    parser.add_argument("--queue", type=int, default=200)
    parser.add_argument("--churn", type=int, default=200, help="jobs that end, and jobs that arrive, before each tick")
    parser.add_argument("--ticks", type=int, default=30)
    parser.add_argument("--against", metavar="REV", help="also time the ticks of this commit, interleaved")
    parser.add_argument("--rounds", type=int, default=3, help="with --against: runs of each tree")
    args = _setup.parse(parser, nodes=50, running=250, queue=20, churn=20, ticks=3)
    _setup.fresh_database(DATABASE_URL, SCHEDULER_QUEUE="bench-steady-scheduler")

    import redis
    from django.conf import settings
    from django.db import connection

    from scheduler.models import Node, Workload, WorkloadStatus
    from scheduler.tick import schedule_tick

    rng = random.Random(2)
    cluster_create(args.nodes)
    users = users_create(50)
    queue_add(args.running + args.queue, users, rng, SHAPES)
    running_mark(schedule_tick().placed, rng)
    if args.against:
        return against(args)
    submitted = args.running + args.queue
    ticks, placed = [], 0
    queued = []
    profile = os.environ.get("BENCH_PROFILE")  # a file: cProfile's stats of the timed ticks
    if profile:
        import cProfile

        profiler = cProfile.Profile()
    for number in range(args.ticks):
        reconcile_beat(number)
        departures(args.churn, rng)
        queue_add(args.churn, users, rng, SHAPES, first=submitted)
        submitted += args.churn
        queued.append(Workload.objects.filter(status=WorkloadStatus.QUEUED).count())
        if profile:
            profiler.enable()
        started = time.perf_counter()
        result = schedule_tick()
        ticks.append(time.perf_counter() - started)
        if profile:
            profiler.disable()
        placed += len(result.placed)
        running_mark(result.placed, rng)
    if profile:
        profiler.dump_stats(profile)
    running = Workload.objects.filter(status=WorkloadStatus.RUNNING).count()
    with connection.cursor() as cursor:
        cursor.execute(ACCOUNTING_ERRORS)
        errors = cursor.fetchone()[0]
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(*[node.queue for node in Node.objects.all()], settings.SCHEDULER_QUEUE)
    ordered = sorted(ticks)
    _setup.report(
        {
            "gpus": 8 * args.nodes,
            "running": running,
            "queued": round(statistics.median(queued)),
            "churn": args.churn,
            "ticks": args.ticks,
            "placed": placed,
            "tick_p50_ms": round(1000 * statistics.median(ordered), 1),
            "tick_p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1),
            "tick_max_ms": round(1000 * ordered[-1], 1),
            "placements_per_s": round(placed / sum(ticks), 1),
        },
        errors=errors,
    )


def schema_of(tree: Path, template: str, copy: str) -> str:
    """A database (URL) like ``template`` (prepared by this tree) in ``tree``'s schema: where this tree has
    migrations that ``tree`` has not, ``copy`` with them unapplied (by this tree, which has them), so that each
    tree runs on its own tables and triggers; else ``template`` itself."""
    import subprocess

    targets = []
    for folder in sorted(_setup.ROOT.glob("*/migrations")):
        app = folder.parent.name
        ours = sorted(p.stem for p in folder.glob("[0-9][0-9][0-9][0-9]_*.py"))
        theirs = sorted(p.stem for p in (tree / app / "migrations").glob("[0-9][0-9][0-9][0-9]_*.py"))
        if ours[: len(theirs)] == theirs and len(ours) > len(theirs):
            targets.append((app, theirs[-1] if theirs else "zero"))
    if not targets:
        return template
    _setup.database_create(copy, template=template.rsplit("/", 1)[1])
    for app, migration in targets:
        migrate = [sys.executable, "manage.py", "migrate", "-v0", app, migration]
        subprocess.run(migrate, cwd=_setup.ROOT, env={**os.environ, "DATABASE_URL": copy}, check=True)
    print(f"{tree.name}: its schema, {', '.join(f'{app} {name}' for app, name in targets)}", flush=True)
    return copy


def against(args) -> None:
    """Time ``args.ticks`` ticks in this tree and in ``args.against``'s, ``args.rounds`` times each, interleaved."""
    import json
    import subprocess
    import tempfile

    from django.db import connections

    from scheduler import beside

    connections.close_all()
    beside.close()  # the tick's second connection
    name = DATABASE_URL.rsplit("/", 1)[1]
    template, run = f"{DATABASE_URL}_tpl", f"{DATABASE_URL}_run"
    _setup.database_create(template, template=name)
    rounds = Path(__file__).resolve().parent / "_tick_rounds.py"
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder) / "base"
        add = ["git", "worktree", "add", "-q", "--detach", str(base), args.against]
        subprocess.run(add, cwd=_setup.ROOT, check=True)
        (base / "var").symlink_to(_setup.ROOT / "var")  # the signing keys the launches are signed with
        templates = {"this": template, "base": schema_of(base, template, f"{DATABASE_URL}_base_tpl")}
        results: dict[str, list[dict]] = {"base": [], "this": []}
        try:
            for number in range(args.rounds):
                order = [("base", base), ("this", _setup.ROOT)]
                for side, tree in order if number % 2 == 0 else order[::-1]:
                    _setup.database_create(run, template=templates[side].rsplit("/", 1)[1])
                    done = subprocess.run(
                        [
                            sys.executable,
                            str(rounds),
                            "--ticks",
                            str(args.ticks),
                            "--churn",
                            str(args.churn),
                            "--seed",
                            str(number),
                        ],
                        cwd=tree,
                        env={**os.environ, "DATABASE_URL": run},
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    results[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
                    print(side, results[side][-1], flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=_setup.ROOT, check=False)
    for url in {run, *templates.values()}:
        _setup.database_drop(url)

    def median(side: str, key: str) -> float:
        return statistics.median(r[key] for r in results[side])

    figures = {}
    for key in ("tick_p50_ms", "tick_p99_ms", "placements_per_s"):
        figures[f"base_{key}"], figures[key] = round(median("base", key), 1), round(median("this", key), 1)
    figures["p99_ratio"] = round(figures["tick_p99_ms"] / figures["base_tick_p99_ms"], 3)
    figures["placements_ratio"] = round(figures["placements_per_s"] / figures["base_placements_per_s"], 3)
    figures["against"] = args.against
    _setup.report(figures, errors=sum(r["errors"] for side in results.values() for r in side))


if __name__ == "__main__":
    main()
