"""One UPDATE for many rows with different values: ``UPDATE ... FROM unnest(arrays)`` on PostgreSQL.

Django's ``bulk_update`` writes a CASE per column with a WHEN per row: for the
tick's batches of placements, and its accrual over running workloads, that
statement costs tens of milliseconds to seconds to build and run. PostgreSQL
joins one array per column instead (a handful of parameters, whatever the number
of rows); other databases (SQLite in development) get one UPDATE a row.
"""

from django.db import connection
from django.db.models import F
from django.db.models.sql import Query


def rows_update(model, objects: list, fields: list[str], *, add: tuple[str, ...] = (), **same) -> None:
    """Write ``fields`` of each object (all of the same model) to its row, and ``same`` (field=value, one
    value or expression, such as ``Now()``, for every row) as well, in one statement.

    ``add``: fields whose object value is added to the row's own (``column = column + value``), so a
    write of the column made since the object was read is kept, not overwritten."""
    if not objects:
        return
    columns = [model._meta.get_field(name) for name in [*fields, *add]]
    if connection.vendor != "postgresql":
        # One UPDATE a row: ``objects`` need not be model instances (the tick's accrual passes its own
        # records), which ``bulk_update`` requires.
        for obj in objects:
            values = {c.attname: getattr(obj, c.attname) for c in columns if c.name not in add}
            values |= {name: F(name) + getattr(obj, name) for name in add}
            model.objects.filter(pk=obj.pk).update(**values, **same)
        return
    added = {model._meta.get_field(name).column for name in add}
    pk = model._meta.pk
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    names = ", ".join(quote(c.column) for c in [pk, *columns])
    arrays = ", ".join(f"%s::{c.db_type(connection)}[]" for c in [pk, *columns])
    compiler = Query(model).get_compiler(connection=connection)
    shared, params = [], []
    for name, value in same.items():
        column = model._meta.get_field(name)
        if hasattr(value, "resolve_expression"):
            sql, expression_params = compiler.compile(value.resolve_expression(compiler.query))
        else:
            sql, expression_params = "%s", [column.get_db_prep_save(value, connection)]
        shared.append(f"{quote(column.column)} = {sql}")
        params += expression_params
    assignments = ", ".join(
        [
            f"{quote(c.column)} = {table}.{quote(c.column)} + v.{quote(c.column)}"
            if c.column in added
            else f"{quote(c.column)} = v.{quote(c.column)}"
            for c in columns
        ]
        + shared
    )
    params += [[pk.get_db_prep_value(obj.pk, connection) for obj in objects]] + [
        [c.get_db_prep_save(getattr(obj, c.attname), connection) for obj in objects] for c in columns
    ]
    sql = (
        f"UPDATE {table} SET {assignments} FROM unnest({arrays}) AS v({names}) "
        f"WHERE {table}.{quote(pk.column)} = v.{quote(pk.column)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
