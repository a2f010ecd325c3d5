"""A migration operation that leaves room on a table's pages (PostgreSQL's fillfactor), for tables whose
rows are written again and again in columns no index covers: such updates then stay on their page (HOT)
and add no index entries. Other databases have no such setting: nothing to do there."""

from django.db import migrations


def fillfactor(table: str, percent: int) -> migrations.RunPython:
    def forwards(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {percent})")

    def backwards(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f"ALTER TABLE {table} RESET (fillfactor)")

    return migrations.RunPython(forwards, backwards, elidable=False)
