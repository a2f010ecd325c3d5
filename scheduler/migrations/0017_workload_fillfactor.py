"""Room on each page of the workload table for HOT updates (PostgreSQL's fillfactor 70).

The tick writes the attained service of ~400 running workloads every tick (scheduler.services.accrual)
and the node agents their measured utilization: columns no index covers. On full pages no such update
can stay on its page (HOT), so each one added an entry to every one of the table's eight indexes, and
the index scans of the tick walked dead entries (60-70k in the status index for 5.2k live rows in the
steady-state bench). With room on the page they are HOT: the accrual write of the bench's ticks took
13 ms instead of 20 ms. Pages written from now on keep the room; ``VACUUM FULL scheduler_workload``
(which locks the table while it runs) gives it to the existing ones.
"""

from django.db import migrations

from core.migration_ops import fillfactor


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0016_gangs")]

    operations = [fillfactor("scheduler_workload", 70)]
