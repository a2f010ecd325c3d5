"""Timed ticks of bench/tick_steady.py on a database it prepared, in the tree this runs in (its working directory):
``tick_steady.py --against REV`` runs it in both trees, each on a fresh copy of the same prepared database.

    cd TREE && python /path/to/bench/_tick_rounds.py --ticks 20 --seed 1   (DATABASE_URL: the copy)

Uses the tree's own tick and the tree's own bench helpers (``tick_steady``, ``tick_latency``), so a tree from before
this script existed can be measured. Two untimed ticks first (the tick's process keeps state across ticks, as a
worker does all day). Ends with one JSON line: tick_p50_ms, tick_p99_ms, placements_per_s, placed, errors.
"""

import argparse
import json
import os
import random
import statistics
import sys
import time

TREE = os.getcwd()
sys.path[:0] = [TREE, os.path.join(TREE, "bench")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--churn", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    import django

    django.setup()
    import tick_steady
    from django.contrib.auth import get_user_model
    from django.db import connection
    from tick_latency import queue_add
    from tick_steady import ACCOUNTING_ERRORS, SHAPES, departures, running_mark

    from scheduler.models import Workload
    from scheduler.tick import schedule_tick

    rng = random.Random(args.seed)
    users = list(get_user_model().objects.order_by("pk"))
    submitted = Workload.objects.count()
    ticks, placed = [], 0
    reconcile_beat = getattr(tick_steady, "reconcile_beat", None)  # a tree that has nothing to fold has none
    for number in range(args.ticks + 2):
        if reconcile_beat is not None:
            reconcile_beat(number)
        departures(args.churn, rng)
        queue_add(args.churn, users, rng, SHAPES, first=submitted)
        submitted += args.churn
        started = time.perf_counter()
        result = schedule_tick()
        took = time.perf_counter() - started
        if number >= 2:
            ticks.append(took)
            placed += len(result.placed)
        running_mark(result.placed, rng)
    with connection.cursor() as cursor:
        cursor.execute(ACCOUNTING_ERRORS)
        errors = cursor.fetchone()[0]
    ordered = sorted(ticks)
    print(
        json.dumps(
            {
                "tick_p50_ms": round(1000 * statistics.median(ordered), 1),
                "tick_p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1),
                "placements_per_s": round(placed / sum(ticks), 1),
                "placed": placed,
                "errors": errors,
            }
        )
    )


if __name__ == "__main__":
    main()
