"""One UPDATE for many rows with different values: ``UPDATE ... FROM (VALUES ...)`` on PostgreSQL.

Django's ``bulk_update`` writes a CASE per column with a WHEN per row: for the
tick's batches of placements that statement costs tens of milliseconds to build
and run. PostgreSQL joins a VALUES list instead; other databases (SQLite in
development) use ``bulk_update``.
"""

from django.db import connection


def rows_update(model, objects: list, fields: list[str]) -> None:
    """Write ``fields`` of each object (all of the same model) to its row, in one statement."""
    if not objects:
        return
    if connection.vendor != "postgresql":
        model.objects.bulk_update(objects, fields)
        return
    columns = [model._meta.get_field(name) for name in fields]
    pk = model._meta.pk
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    assignments = ", ".join(f"{quote(c.column)} = v.{quote(c.column)}::{c.db_type(connection)}" for c in columns)
    values = ", ".join(["(" + ", ".join(["%s"] * (len(columns) + 1)) + ")"] * len(objects))
    names = ", ".join(quote(c.column) for c in [pk, *columns])
    params = [
        value
        for obj in objects
        for value in (
            pk.get_db_prep_value(obj.pk, connection),
            *(c.get_db_prep_save(getattr(obj, c.attname), connection) for c in columns),
        )
    ]
    sql = (
        f"UPDATE {table} SET {assignments} FROM (VALUES {values}) AS v({names}) "
        f"WHERE {table}.{quote(pk.column)} = v.{quote(pk.column)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
