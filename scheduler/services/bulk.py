"""One UPDATE (or INSERT) for many rows with different values: ``... FROM unnest(arrays)`` on PostgreSQL.

Django's ``bulk_update`` writes a CASE per column with a WHEN per row: for the
tick's batches of placements, and its accrual over running workloads, that
statement costs tens of milliseconds to seconds to build and run. PostgreSQL
joins one array per column instead (a handful of parameters, whatever the number
of rows); other databases (SQLite in development) get one UPDATE a row.
"""

from datetime import datetime

from django.db import connection, models
from django.db.models import F
from django.db.models.sql import Query
from django.utils import timezone

from core.pg_arrays import array_literal


def rows_update(
    model,
    objects: list,
    fields: list[str],
    *,
    add: tuple[str, ...] = (),
    version: str | None = None,
    returning: dict | None = None,
    **same,
) -> list:
    """Write ``fields`` of each object (all of the same model) to its row, and ``same`` (field=value, one
    value or expression, such as ``Now()``, for every row) as well, in one statement.

    ``add``: fields whose object value is added to the row's own (``column = column + value``), so a
    write of the column made since the object was read is kept, not overwritten.

    PostgreSQL only (elsewhere every row is written and nothing returned): ``version``, an SQL expression of a
    row's version (``scheduler.holding.row_version``): only rows whose version is still the object's ``version``
    are written; ``returning``: name -> SQL expression of the written row (``version`` among them, say). Returns
    the written rows as (pk, *returning's values), in no particular order."""
    if not objects:
        return []
    columns = [model._meta.get_field(name) for name in [*fields, *add]]
    if connection.vendor != "postgresql":
        # One UPDATE a row: ``objects`` need not be model instances (the tick's accrual passes its own
        # records), which ``bulk_update`` requires.
        for obj in objects:
            values = {c.attname: getattr(obj, c.attname) for c in columns if c.name not in add}
            values |= {name: F(name) + getattr(obj, name) for name in add}
            model.objects.filter(pk=obj.pk).update(**values, **same)
        return []
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
    ids = _db_values(pk, [obj.pk for obj in objects])
    params += [ids] + [_db_values(c, [getattr(obj, c.attname) for obj in objects]) for c in columns]
    # "= ANY" the ids as well (typed): the rows found through the primary key. Joined to the arrays alone, the
    # planner hashed the whole table (every workload ever submitted) for the accrual's 500 rows: 12 of its 21 ms.
    key = f"{table}.{quote(pk.column)}"
    where = f"{key} = v.{quote(pk.column)} AND {key} = ANY(%s::{pk.db_type(connection)}[])"
    if version is not None:
        arrays, names = f"{arrays}, %s::text[]", f"{names}, version_read"
        params.append(array_literal(f'"{obj.version}"' for obj in objects))  # digits, parentheses and a comma
        where += f" AND {version} = v.version_read"
    params.append(ids)  # for "= ANY", after the arrays
    sql = f"UPDATE {table} SET {assignments} FROM unnest({arrays}) AS v({names}) WHERE {where}"
    if returning:
        sql += f" RETURNING {table}.{quote(pk.column)}, " + ", ".join(returning.values())
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if returning else []


def rows_insert(model, fields: list[str], rows: list[tuple], *, returning: str | None = None) -> object:
    """Insert ``rows`` (one value per field, in the order of ``fields``) in one statement; columns not named take
    their database defaults. Returns the ``returning`` column of the first row (None when there are no rows):
    such as a ``Now()`` default, the same for every row of one statement.

    Fields with a default of Django's own (``auto_now_add``, ``default=``) and no database default get it
    here, as ``bulk_create`` would give it. The tick's 200 placements a batch each write an event and their
    shares: ``bulk_create`` built a model object, and a parameter per value, for each."""
    if not rows:
        return None
    fields, rows = _python_defaults(model, fields, rows)
    columns = [model._meta.get_field(name) for name in fields]
    if connection.vendor != "postgresql":
        made = model.objects.bulk_create(model(**dict(zip(fields, row, strict=True))) for row in rows)
        return getattr(made[0], returning) if returning is not None else None  # database defaults come back
    quote = connection.ops.quote_name
    names = ", ".join(quote(c.column) for c in columns)
    arrays = ", ".join(f"%s::{c.db_type(connection)}[]" for c in columns)
    values = [_db_values(c, column) for c, column in zip(columns, zip(*rows, strict=True), strict=True)]
    sql = f"INSERT INTO {quote(model._meta.db_table)} ({names}) SELECT * FROM unnest({arrays})"
    if returning is not None:
        sql += f" RETURNING {quote(model._meta.get_field(returning).column)}"
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        return cursor.fetchone()[0] if returning is not None else None


def _python_defaults(model, fields: list[str], rows: list[tuple]) -> tuple[list[str], list[tuple]]:
    """``fields`` and ``rows`` with the model's Python-side defaults of the fields not named added."""
    named = {model._meta.get_field(name).name for name in fields}
    now = timezone.now()
    extra = []
    for field in model._meta.concrete_fields:
        if field.primary_key or field.name in named or field.db_default is not models.NOT_PROVIDED:
            continue
        if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            extra.append((field.attname, lambda: now))
        elif field.has_default():
            extra.append((field.attname, field.get_default))
    if not extra:
        return fields, rows
    return [*fields, *(name for name, _ in extra)], [(*row, *(make() for _, make in extra)) for row in rows]


# Fields whose value, as a model object or the tick's records hold it (int, float, bool, str, None), psycopg
# sends as Django would: no per-value conversion (the accrual's ~2,000 values a tick cost milliseconds).
PLAIN = (models.IntegerField, models.FloatField, models.BooleanField, models.CharField, models.ForeignKey)


def _db_values(column, values) -> list | str:
    """A column's values for an array parameter: numbers and aware times as one array literal
    (``core.pg_arrays``), anything else as a list of what Django would send."""
    if isinstance(column, PLAIN):
        values = list(values)
    elif isinstance(column, models.DateTimeField) and all(_aware(value) for value in values):
        return array_literal(None if value is None else f'"{value.isoformat()}"' for value in values)
    else:
        values = [column.get_db_prep_save(value, connection) for value in values]
    if all(value is None or type(value) in (int, float) for value in values):
        return array_literal(None if value is None else repr(value) for value in values)
    return values


def _aware(value) -> bool:
    return value is None or (isinstance(value, datetime) and value.utcoffset() is not None)
