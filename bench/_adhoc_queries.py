import random, time, collections, sys
import _setup
import tick_steady as ts
from tick_latency import cluster_create, queue_add, users_create
import argparse
p = argparse.ArgumentParser(); p.add_argument("--ticks", type=int, default=6)
args = _setup.parse(p)
_setup.fresh_database(ts.DATABASE_URL, SCHEDULER_QUEUE="bench-steady-scheduler")
from django.db import connection
from django.test.utils import CaptureQueriesContext
from scheduler.tick import schedule_tick
rng = random.Random(2)
cluster_create(1000); users = users_create(50)
queue_add(5200, users, rng, ts.SHAPES)
ts.running_mark(schedule_tick().placed, rng)
submitted = 5200
for i in range(args.ticks):
    ts.departures(200, rng); queue_add(200, users, rng, ts.SHAPES, first=submitted); submitted += 200
    with CaptureQueriesContext(connection) as q:
        t = time.perf_counter(); r = schedule_tick(); dt = time.perf_counter() - t
    ts.running_mark(r.placed, rng)
    if i == args.ticks - 1:
        c = collections.Counter()
        tm = collections.Counter()
        for x in q.captured_queries:
            k = x["sql"][:110]
            c[k] += 1; tm[k] += float(x["time"])
        for k, n in c.most_common():
            print(f"{n:3d} {1000*tm[k]:7.1f}ms {k}")
    print(f"tick {i}: {1000*dt:.1f} ms, {len(q.captured_queries)} queries, sum {1000*sum(float(x['time']) for x in q.captured_queries):.1f} ms")
