"""Settlement on PostgreSQL: 100,000 metered segments become usage postings, on a ledger with a history.

The data as a busy month leaves it: 1,000 accounts (funded), 4 GPU types, spot prices that change
every 5 minutes (``billing.prices`` recomputes them every SPOT_PRICE_S = 300 s), a rate change in the
window, and ``--history`` postings already settled (earlier segments of the same work; the
postings' indexes and the unique (segment, hour) index hold them). Then ``--segments`` closed
segments of fractions and whole cards, one in five on spot, 1 s to ``--max-hours`` long (default
1 h: what an hourly settlement run meets; about half cross an hour boundary, so ~1.5 postings per
segment), settled by ``billing.settlement.settle`` — timed — in batches (compute lines, COPY
postings, move balances, advance segments). Errors: the ledger check (debits = credits, every
balance = the sum of its postings) failing, and segments left unsettled.

    python bench/billing_settle.py [--segments 100000] [--max-hours 1] [--history 1000000]

Uses its own PostgreSQL database (gpucloud_bench_billing, recreated). Ends with
{"segments", "postings", "seconds", "postings_per_s", "segments_per_s", "anchor_copy_s",
"ratio_vs_anchor", "errors", "commit"}; target: 100,000 segments in under 3 s. The anchor: a plain
COPY of the same postings into a table with three indexes, timed in the same run (on a shared
machine the ratio holds where the seconds do not).
"""

import argparse
import os
import random
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import _setup

DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpucloud_bench_billing")
MODELS = [("RTX3090", "1.58"), ("A100-80GB", "6.68"), ("H100", "13.98"), ("RTXA5000", "1.38")]
START = datetime(2026, 11, 1, tzinfo=UTC)
ACCOUNTS = 1000
SPOT_EVERY = timedelta(minutes=5)


def setup():
    _setup.fresh_database(DATABASE_URL)


def populate(n: int, max_hours: float, history: int) -> None:
    from django.contrib.auth import get_user_model

    from billing.ledger import user_account
    from billing.models import MeterSegment, RateCard
    from scheduler.models import Workload

    first_rate = {}
    for model, price in MODELS:
        first_rate[model] = RateCard.objects.create(
            gpu_model=model, effective_from=START - timedelta(days=60), card_hour=Decimal(price)
        )
        RateCard.objects.create(
            gpu_model=model, effective_from=START + timedelta(days=3), card_hour=Decimal(price) * Decimal("1.1")
        )
    rng = random.Random(7)
    spot_prices(rng)
    users = get_user_model().objects.bulk_create(get_user_model()(username=f"u{i}") for i in range(ACCOUNTS))
    # As billing.tasks.segment_assign leaves them when each segment opens: payer and rate recorded.
    accounts = {u.pk: user_account(u).pk for u in users}
    workloads = Workload.objects.bulk_create(
        (
            Workload(
                owner=users[i % ACCOUNTS],
                kind="instance",
                name=f"w{i}",
                image_ref="x",
                gpu_model=MODELS[i % 4][0],
                gpu_count=1 if i % 3 else 2,
                gpu_milli=1000 if i % 3 == 0 else rng.choice([100, 300, 500, 1000]),
                cpu_cores=rng.choice([1, 4, 8, 16]),
                memory_mb=rng.choice([4096, 32768, 65536]),
                disk_gb=50,
                spot=i % 5 == 0,
                status="stopped",
            )
            for i in range(n)
        ),
        batch_size=5000,
    )
    history_create(history)
    segments = []
    for w in workloads:
        start = START + timedelta(seconds=rng.randrange(0, 6 * 24 * 3600))
        segments.append(
            MeterSegment(
                workload=w,
                started_at=start,
                ended_at=start + timedelta(seconds=rng.randrange(1, int(max_hours * 3600))),
                account_id=accounts[w.owner_id],
                rate_card=first_rate[w.gpu_model],
                spot=w.spot,
            )
        )
    MeterSegment.objects.bulk_create(segments, batch_size=5000)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")  # as autovacuum would have, long before an hourly run
        # The setup's 1.2 GB written out before the timed run, not during it: its checkpoint competed with
        # the run for the disk and the two cores (same tree, 5.2-6.7 s from run to run without it).
        cursor.execute("CHECKPOINT")


def spot_prices(rng: random.Random) -> None:
    """Every 5 minutes over the window, per GPU type: the on-demand price x (0.33 + 0.37 x load)."""
    from billing.models import SpotPrice

    rows, steps = [], int(timedelta(days=70) / SPOT_EVERY)
    for model, price in MODELS:
        load = 0.5
        for k in range(steps):
            load = min(max(load + rng.uniform(-0.05, 0.05), 0.0), 1.0)
            at = START - timedelta(days=60) + k * SPOT_EVERY
            card_hour = (Decimal(price) * Decimal(0.33 + 0.37 * load)).quantize(Decimal("0.01"))
            rows.append(SpotPrice(gpu_model=model, effective_from=at, card_hour=card_hour, load=load))
    SpotPrice.objects.bulk_create(rows, batch_size=5000)


HISTORY_SQL = """
WITH w AS (SELECT min(id) AS first, count(*) AS n FROM scheduler_workload)
INSERT INTO billing_metersegment (started_at, ended_at, end_reason, workload_id, settled_until, account_id,
                                  rate_card_id, no_gpu, spot)
SELECT t.started, t.started + ((g * 104729) %% 500 + 1) * interval '1 second', 'stopped', wl.id,
       t.started + ((g * 104729) %% 500 + 1) * interval '1 second', a.id, r.id, false, wl.spot
FROM w, generate_series(0::bigint, %(history)s - 1) AS g
JOIN scheduler_workload wl ON wl.id = (SELECT first FROM w) + g %% (SELECT n FROM w)
JOIN billing_account a ON a.user_id = wl.owner_id
JOIN LATERAL (SELECT id FROM billing_ratecard WHERE gpu_model = wl.gpu_model ORDER BY effective_from LIMIT 1) r ON true
CROSS JOIN LATERAL (SELECT %(start)s::timestamptz - interval '55 days' + (g / w.n) * interval '5 hours'
                           + ((g * 7919) %% 3000) * interval '1 second' AS started) t;
INSERT INTO billing_posting (created_at, kind, debit_id, credit_id, amount, currency, segment_id, period_start,
                             seconds, gpu_seconds, detail, memo)
SELECT s.ended_at, 'usage', s.account_id, %(revenue)s,
       round((extract(epoch FROM s.ended_at - s.started_at) / 900)::numeric, 2),
       'CNY', s.id, date_trunc('hour', s.started_at), extract(epoch FROM s.ended_at - s.started_at),
       extract(epoch FROM s.ended_at - s.started_at), '{"pieces": [{"hourly": "1.58", "rate": 1}]}', ''
FROM billing_metersegment s WHERE s.settled_until IS NOT NULL;
INSERT INTO billing_posting (created_at, kind, debit_id, credit_id, amount, currency, detail, memo)
SELECT %(start)s::timestamptz - interval '58 days', 'topup', %(funding)s, a.id, 100000, 'CNY', '{}', 'bench'
FROM billing_account a WHERE a.kind = 'user';
UPDATE billing_account a SET balance = COALESCE((SELECT sum(amount) FROM billing_posting WHERE credit_id = a.id), 0)
                                     - COALESCE((SELECT sum(amount) FROM billing_posting WHERE debit_id = a.id), 0);
"""


def history_create(history: int) -> None:
    """``history`` settled segments of the same work, weeks earlier, each with its one posting; funded wallets."""
    from django.db import connection

    from billing.ledger import platform_account
    from billing.models import AccountKind

    revenue, funding = platform_account(AccountKind.REVENUE), platform_account(AccountKind.FUNDING)
    with connection.cursor() as cursor:
        cursor.execute(HISTORY_SQL, {"history": history, "start": START, "revenue": revenue.pk, "funding": funding.pk})


ANCHOR_TABLE = """
CREATE TEMPORARY TABLE anchor (LIKE billing_posting INCLUDING DEFAULTS INCLUDING IDENTITY);
CREATE UNIQUE INDEX ON anchor (segment_id, period_start);
CREATE INDEX ON anchor (debit_id);
CREATE INDEX ON anchor (created_at);
"""


def copy_anchor() -> float:
    """Seconds a plain COPY of the postings just made takes into a table with three indexes (the
    floor the issue names: nothing but the rows' writing), measured in the same run, on the same load."""
    from django.db import connection

    columns = "created_at, kind, debit_id, credit_id, amount, currency, segment_id, period_start, seconds, "
    columns += "gpu_seconds, detail, memo"
    with connection.cursor() as cursor:
        with cursor.copy(
            f"COPY (SELECT {columns} FROM billing_posting WHERE period_start >= %s) TO STDOUT", [START]
        ) as copy:
            data = b"".join(bytes(block) for block in copy)
        cursor.execute(ANCHOR_TABLE)
        started = time.perf_counter()
        with cursor.copy(f"COPY anchor ({columns}) FROM STDIN") as copy:
            copy.write(data)
        return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=100_000)
    parser.add_argument("--max-hours", type=float, default=1.0, help="longest segment (postings: one per hour touched)")
    parser.add_argument("--history", type=int, default=1_000_000, help="postings settled before")
    args = _setup.parse(parser, segments=2000, history=10_000)
    setup()
    populate(args.segments, args.max_hours, args.history)
    from billing.ledger import ledger_check
    from billing.selectors import pending_segments
    from billing.settlement import settle

    started = time.perf_counter()
    done = settle(now=START + timedelta(days=8))
    seconds = time.perf_counter() - started
    check = ledger_check()
    left = pending_segments().count()
    anchor = copy_anchor()
    _setup.report(
        {
            "segments": done.segments,
            "postings": done.postings,
            "seconds": round(seconds, 2),
            "postings_per_s": round(done.postings / seconds),
            "segments_per_s": round(done.segments / seconds),
            "anchor_copy_s": round(anchor, 2),
            "ratio_vs_anchor": round(seconds / anchor, 2),
            "history_postings": args.history,
            "ledger_ok": check.ok,
            "left_unsettled": left,
            "amount": str(done.amount),
        },
        errors=(not check.ok) + left,
    )


if __name__ == "__main__":
    main()
