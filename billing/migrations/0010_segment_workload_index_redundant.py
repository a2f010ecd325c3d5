"""Meter segments lose their index on workload alone: one_segment_per_run (workload, started_at) serves it.

Settling updates every segment it charges, and each update writes an entry into every index of the
table. Django's AlterField would drop every index on the column, one_open_segment's partial unique
index among them: the index is dropped by name instead.
"""

import django.db.models.deletion
from django.db import migrations, models

INDEX = "billing_metersegment_workload_id_92e4bd09"


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0009_posting_references_per_statement"),
        ("scheduler", "0016_gangs"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="metersegment",
                    name="workload",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="meter_segments",
                        to="scheduler.workload",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f"DROP INDEX IF EXISTS {INDEX}",
                    f"CREATE INDEX {INDEX} ON billing_metersegment (workload_id)",
                ),
            ],
        ),
    ]
