"""Settlement on PostgreSQL: 100,000 metered segments become usage postings.

Segments of 50 users, 4 GPU types, fractions and whole cards, on-demand and
spot, 1 s to ``--max-hours`` long (default 1 h: what an hourly settlement run
meets; about half cross an hour boundary, so ~1.5 postings per segment; some
cross a rate change), all closed; ``billing.settlement.settle`` charges them in
batches (compute lines, COPY postings, move balances, advance segments).

    python bench/billing_settle.py [--segments 100000] [--max-hours 1]

Uses its own PostgreSQL database (gpucloud_bench_billing, recreated). Ends with
{"segments", "postings", "seconds", "postings_per_s", "segments_per_s"}.
"""

import argparse
import json
import os
import random
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import _setup

DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpucloud_bench_billing")
MODELS = [("RTX3090", "1.58"), ("A100-80GB", "6.68"), ("H100", "13.98"), ("RTXA5000", "1.38")]
START = datetime(2026, 11, 1, tzinfo=UTC)


def setup():
    _setup.fresh_database(DATABASE_URL)


def populate(n: int, max_hours: float) -> None:
    from django.contrib.auth import get_user_model

    from billing.ledger import user_account
    from billing.models import MeterSegment, RateCard
    from scheduler.models import Workload

    first_rate = {}
    for model, price in MODELS:
        first_rate[model] = RateCard.objects.create(
            gpu_model=model, effective_from=START - timedelta(days=1), card_hour=Decimal(price)
        )
        RateCard.objects.create(
            gpu_model=model, effective_from=START + timedelta(days=3), card_hour=Decimal(price) * Decimal("1.1")
        )
    users = [get_user_model().objects.create_user(f"u{i}") for i in range(50)]
    # As billing.tasks.segment_assign leaves them when each segment opens: payer and rate recorded.
    accounts = {u.pk: user_account(u) for u in users}
    rng = random.Random(7)
    workloads = Workload.objects.bulk_create(
        (
            Workload(
                owner=users[i % 50],
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
    segments = []
    for w in workloads:
        start = START + timedelta(seconds=rng.randrange(0, 6 * 24 * 3600))
        segments.append(
            MeterSegment(
                workload=w,
                started_at=start,
                ended_at=start + timedelta(seconds=rng.randrange(1, int(max_hours * 3600))),
                account=accounts[w.owner_id],
                rate_card=first_rate[w.gpu_model],
                spot=w.spot,
            )
        )
    MeterSegment.objects.bulk_create(segments, batch_size=5000)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=100_000)
    parser.add_argument("--max-hours", type=float, default=1.0, help="longest segment (postings: one per hour touched)")
    args = parser.parse_args()
    setup()
    populate(args.segments, args.max_hours)
    from billing.ledger import ledger_check
    from billing.settlement import settle

    started = time.perf_counter()
    done = settle(now=START + timedelta(days=8))
    seconds = time.perf_counter() - started
    check = ledger_check()
    print(
        json.dumps(
            {
                "segments": done.segments,
                "postings": done.postings,
                "seconds": round(seconds, 2),
                "postings_per_s": round(done.postings / seconds),
                "segments_per_s": round(done.segments / seconds),
                "ledger_ok": check.ok,
                "amount": str(done.amount),
            }
        )
    )


if __name__ == "__main__":
    main()
