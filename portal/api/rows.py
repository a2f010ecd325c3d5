"""A serializer's output built from ``QuerySet.values()`` rows: the same JSON, without model instances.

Lists are the hot path of the API. Building five model objects per row (instance,
workload, node, image, GPU type) and walking them attribute by attribute cost
most of a list request; here the query selects exactly the columns the
serializer's fields name (``source="workload.status"`` -> ``workload__status``)
and each value goes through that same field's ``to_representation``. The shape
is the serializer's own, so the two cannot drift (tests compare them).
"""

from rest_framework import serializers


def _plan(serializer: serializers.Serializer, prefix: str = "") -> list[tuple]:
    plan = []
    for name, field in serializer.fields.items():
        path = prefix + (field.source if field.source != "*" else name).replace(".", "__")
        if isinstance(field, serializers.Serializer):
            plan.append((name, None, _plan(field, path + "__")))
        else:
            plan.append((name, path, field))
    return plan


def _paths(plan: list[tuple]) -> list[str]:
    return [p for _, path, field in plan for p in (_paths(field) if path is None else [path])]


def _build(plan: list[tuple], row: dict) -> dict:
    out = {}
    for name, path, field in plan:
        if path is None:
            out[name] = _build(field, row)
        else:
            value = row[path]
            out[name] = None if value is None else field.to_representation(value)
    return out


class Rows:
    """``Rows(InstanceOutput)``: ``.values(queryset)`` to select, ``.build(rows)`` to shape."""

    def __init__(self, serializer_class):
        self.plan = _plan(serializer_class())
        self.paths = _paths(self.plan)

    def values(self, queryset):
        return queryset.values(*self.paths)

    def build(self, rows) -> list[dict]:
        return [_build(self.plan, row) for row in rows]
