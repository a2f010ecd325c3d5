"""A serializer's output built from ``QuerySet.values()`` rows: the same JSON, without model instances.

Lists are the hot path of the API. Building five model objects per row (instance,
workload, node, image, GPU type) and walking them attribute by attribute cost
most of a list request; here the query selects exactly the columns the
serializer's fields name (``source="workload.status"`` -> ``workload__status``)
and each value goes through that same field's ``to_representation``. The shape
is the serializer's own, so the two cannot drift (tests compare them).

A list's query is also compiled once per shape (``Rows.first``): Django took as long to build and compile
the five-table query as PostgreSQL took to answer it (profiled: about a third of a list request's time).
"""

from collections.abc import Callable

import psycopg
from django.db import connections
from django.utils import timezone
from rest_framework import ISO_8601, serializers
from rest_framework.settings import api_settings

# psycopg prepares a statement unasked after this many runs: never, here.
_ONLY_WHEN_ASKED = 2**62
# Stands for the owner while a list's query is compiled; no account has it (ids are positive).
_OWNER = -982_451_653


# Fields whose to_representation gives back a value of this exact type unchanged (``str(s)``, ``int(i)``, a bool's
# own truth value): asked per value, not per field, as a column may hold something else.
_SAME = {serializers.CharField: str, serializers.IntegerField: int, serializers.BooleanField: bool}
_ISO = "iso"


def _how(field):
    """How ``_build`` writes ``field``'s values: ``_ISO`` (an aware datetime as DRF's default DateTimeField does: ISO
    8601 in the current time zone), a type it passes through unchanged, or None (the field's ``to_representation``)."""
    if type(field) is serializers.DateTimeField:
        output = getattr(field, "format", api_settings.DATETIME_FORMAT)
        if isinstance(output, str) and output.lower() == ISO_8601 and not hasattr(field, "timezone"):
            return _ISO
        return None
    return _SAME.get(type(field))


def _plan(serializer: serializers.Serializer, prefix: str = "") -> list[tuple]:
    plan = []
    for name, field in serializer.fields.items():
        path = prefix + (field.source if field.source != "*" else name).replace(".", "__")
        if isinstance(field, serializers.Serializer):
            plan.append((name, None, _plan(field, path + "__"), None))
        else:
            plan.append((name, path, field, _how(field)))
    return plan


def _paths(plan: list[tuple]) -> list[str]:
    return [p for _, path, field, _ in plan for p in (_paths(field) if path is None else [path])]


def _build(plan: list[tuple], row: dict, zone) -> dict:
    out = {}
    for name, path, field, how in plan:
        if path is None:
            out[name] = _build(field, row, zone)
            continue
        value = row[path]
        if value is None:
            out[name] = None
        elif how is not None and type(value) is how:
            out[name] = value
        elif how is _ISO and value.tzinfo is not None:  # the time zone looked up once a page, not per value
            text = value.astimezone(zone).isoformat()
            out[name] = text[:-6] + "Z" if text.endswith("+00:00") else text
        else:
            out[name] = field.to_representation(value)
    return out


class _PreparedCursor(psycopg.Cursor):
    """A cursor that binds on the server and has PostgreSQL prepare what it runs (psycopg 3's ``prepare=True``)."""

    def execute(self, query, params=None, *, prepare=True, binary=None):
        return super().execute(query, params, prepare=prepare, binary=binary)


def _cursor(connection):
    """A Django cursor for a list's compiled query. On PostgreSQL the statement is prepared once per connection:
    planning the five-table join took longer than running it (0.5 ms against 0.36 ms, EXPLAIN ANALYZE). Nothing
    else is prepared: Django's own cursors bind on the client (they cannot prepare), and the connection's
    threshold for preparing unasked stays out of reach. Elsewhere (SQLite), Django's cursor as it is."""
    if connection.vendor != "postgresql":
        return connection.cursor()
    connection.close_if_health_check_failed()  # as Django's own cursor() does before it hands one out
    connection.ensure_connection()
    connection.validate_thread_sharing()
    raw = connection.connection
    if raw.prepare_threshold is None:  # Django's default: prepared statements off
        raw.prepare_threshold = _ONLY_WHEN_ASKED
    cursor = _PreparedCursor(raw)
    return connection.make_debug_cursor(cursor) if connection.queries_logged else connection.make_cursor(cursor)


class _Compiled:
    """One shape of a list's query, compiled: its SQL, its parameters with the owner's place, its columns and the
    converters Django would apply to them."""

    def __init__(self, queryset):
        compiler = queryset.query.get_compiler(queryset.db)
        self.sql, params = compiler.as_sql()
        self.params = list(params)
        places = [i for i, p in enumerate(self.params) if p == _OWNER]
        if len(places) > 1:
            raise ValueError("the owner appears more than once in the list's query")
        self.owner_at = places[0] if places else None
        self.alias = queryset.db
        query = queryset.query
        self.names = [*query.extra_select, *query.values_select, *query.annotation_select]
        self.converters = compiler.get_converters([s[0] for s in compiler.select[: compiler.col_count]])

    def fetch(self, owner: int | None) -> list[dict]:
        params = self.params
        if self.owner_at is not None:
            params = [*params]
            params[self.owner_at] = owner
        connection = connections[self.alias]
        with _cursor(connection) as cursor:
            cursor.execute(self.sql, params)
            rows = cursor.fetchall()
        names = self.names
        if not self.converters:
            return [dict(zip(names, row, strict=True)) for row in rows]
        out = []
        for row in rows:
            row = list(row)
            for at, (converters, expression) in self.converters.items():
                for converter in converters:
                    row[at] = converter(row[at], expression, connection)
            out.append(dict(zip(names, row, strict=True)))
        return out


class Rows:
    """``Rows(InstanceOutput)``: ``.values(queryset)`` to select, ``.build(rows)`` to shape, ``.first(...)`` for the
    first rows of a list whose query is compiled once per shape."""

    def __init__(self, serializer_class):
        self.plan = _plan(serializer_class())
        self.paths = _paths(self.plan)
        self._compiled: dict[tuple, _Compiled] = {}

    def values(self, queryset):
        return queryset.values(*self.paths)

    def build(self, rows) -> list[dict]:
        zone = timezone.get_current_timezone()
        return [_build(self.plan, row, zone) for row in rows]

    def first(self, queryset_of: Callable, *, owner: int | None, limit: int) -> list[dict]:
        """The first ``limit`` rows of ``queryset_of(owner)`` (its ``values()``), the same as
        ``self.values(queryset_of(owner))[:limit]``. ``queryset_of`` is called only the first time a shape (an
        owner or none, the limit) is asked for, with a stand-in owner; the owner must be a parameter of its
        query (a filter on it), used once."""
        key = (queryset_of, owner is None, limit)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = _Compiled(
                self.values(queryset_of(None if owner is None else _OWNER))[:limit]
            )
            if (owner is None) != (compiled.owner_at is None):
                raise ValueError("the list's query does not filter on its owner once")
        return compiled.fetch(owner)
