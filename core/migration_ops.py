"""Migration operations for what only PostgreSQL has (triggers the ledger relies on, storage settings):
run there, nothing to do on other databases (SQLite in development)."""

from django.db import migrations


def postgresql_sql(forwards: str, backwards: str) -> migrations.RunPython:
    """``forwards`` on migrate, ``backwards`` on unapply, on PostgreSQL only (as written: no parameters)."""

    def step(sql: str):
        def run(apps, schema_editor):
            if schema_editor.connection.vendor == "postgresql":
                schema_editor.execute(sql, params=None)

        return run

    return migrations.RunPython(step(forwards), step(backwards), elidable=False)


def fillfactor(table: str, percent: int, *, previous: int | None = None) -> migrations.RunPython:
    """Room on a table's pages, for tables whose rows are written again and again in columns no index
    covers: such updates then stay on their page (HOT) and add no index entries. Unapplied: ``previous``
    (an earlier migration's), or PostgreSQL's default."""
    back = f"SET (fillfactor = {previous})" if previous else "RESET (fillfactor)"
    return postgresql_sql(f"ALTER TABLE {table} SET (fillfactor = {percent})", f"ALTER TABLE {table} {back}")
