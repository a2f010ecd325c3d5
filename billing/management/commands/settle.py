"""Settle pending usage now (what the hourly beat task does), optionally in smaller batches."""

from django.core.management.base import BaseCommand

from billing import settlement


class Command(BaseCommand):
    help = "Turn pending meter segments into usage postings (idempotent: safe to run again after a crash)."

    def add_arguments(self, parser):
        parser.add_argument("--batch", type=int, default=settlement.BATCH, help="segments per transaction")

    def handle(self, *args, batch, **options):
        done = settlement.settle(batch=batch)
        self.stdout.write(f"settled {done.segments} segments: {done.postings} postings, {done.amount}")
