"""Settlement checks its postings' segments itself; the statement-level trigger skips that part for it.

The trigger of 0009 looks up each segment a statement's postings name (10,000 lookups a settlement
batch: ~0.4 s of a 100,000-segment run, on the connection that writes). Settlement already updates every
segment it posts for, in the same transaction, by id: it refuses the batch (an IntegrityError, the
transaction rolled back) when that UPDATE finds fewer segments than it names. So for its own statements
it sets ``billing.segments_checked`` for the transaction (``set_config(..., true)``) and turns it off again
after its UPDATE; every other writer is still checked by the trigger. The accounts are still checked
for every statement (a few hundred lookups a batch).
"""

from importlib import import_module

from django.db import migrations

from core.migration_ops import postgresql_sql

# 0009's function (before its CREATE TRIGGER), its segment check made conditional.
EARLIER = import_module("billing.migrations.0009_posting_references_per_statement").CREATE
EARLIER = EARLIER.split("CREATE TRIGGER billing_posting_references")[0]
SEGMENT_CHECK = "    IF EXISTS (\n        SELECT 1 FROM (SELECT DISTINCT segment_id"
REFERENCES = EARLIER.replace(
    SEGMENT_CHECK,
    SEGMENT_CHECK.replace(
        "IF EXISTS", "IF current_setting('billing.segments_checked', true) IS DISTINCT FROM 'on' AND EXISTS"
    ),
)
assert REFERENCES.count("segments_checked") == 1


class Migration(migrations.Migration):
    dependencies = [("billing", "0011_segment_fillfactor")]

    operations = [postgresql_sql(REFERENCES, EARLIER)]
