"""Meter segments are rewritten by every settlement run (settled_until advances, hourly for running work):
room on each page lets PostgreSQL update a row in place (a heap-only tuple: no new entry in any of the
table's indexes) when no indexed column changes, which is what settling writes. Pages written from now on
keep half of each page free (room for one new version of every row, as a run that
settles them all needs); a table's older pages keep theirs until rewritten (VACUUM FULL)."""

from django.db import migrations


def fillfactor(percent: int | None):
    def apply(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return  # SQLite rewrites a page whole: nothing to set
        setting = f"SET (fillfactor = {percent})" if percent else "RESET (fillfactor)"
        schema_editor.execute(f"ALTER TABLE billing_metersegment {setting}")

    return apply


class Migration(migrations.Migration):
    dependencies = [("billing", "0015_team_invitations")]

    operations = [migrations.RunPython(fillfactor(50), fillfactor(None))]
