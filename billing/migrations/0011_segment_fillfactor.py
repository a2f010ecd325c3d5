"""Room on each page of the meter segments table for HOT updates (PostgreSQL's fillfactor 70).

A segment is written again when its work stops (its end), each hour its work runs (the hourly
settlement advances ``settled_until``) and when its last stretch is settled: none of these changes an
indexed column. On full pages no such update can stay on its page (HOT), so each one added an entry to
each of the table's four indexes: settling 100,000 segments wrote 6 WAL records a segment and its
segment UPDATE took 1.7-1.9 s of bench/billing_settle.py's run here; with room on the pages,
1.5 s (3 Dec 2026). Pages written from now on keep the room; ``VACUUM FULL billing_metersegment`` (which
locks the table while it runs) gives it to the existing ones. The same as scheduler's 0017 for workloads.
"""

from django.db import migrations

from core.migration_ops import fillfactor


class Migration(migrations.Migration):
    dependencies = [("billing", "0010_segment_workload_index_redundant")]

    operations = [fillfactor("billing_metersegment", 70)]
