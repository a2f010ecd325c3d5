"""Every list the API returns is paginated: ``?page=N&page_size=M`` (at most 200 a page)."""

from django.core.paginator import Paginator
from django.utils.functional import cached_property
from drf_spectacular.utils import inline_serializer
from rest_framework import serializers
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response

from portal.api.rows import Rows


class CheapCountPaginator(Paginator):
    """Counts without a COUNT query when the first page already holds everything (the common case)."""

    @cached_property
    def count(self):
        if hasattr(self.object_list, "query"):
            first = list(self.object_list[: self.per_page + 1])
            if len(first) <= self.per_page:
                self._first_page = first
                return len(first)
        return super().count

    def page(self, number):
        number = self.validate_number(number)
        if number == 1 and getattr(self, "_first_page", None) is not None:
            return self._get_page(self._first_page, number, self)
        return super().page(number)


class Pages(PageNumberPagination):
    django_paginator_class = CheapCountPaginator
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200


def paginated(view, queryset, serializer_class):
    """The page of ``queryset`` the request asks for, serialized, with count / next / previous."""
    pages = Pages()
    page = pages.paginate_queryset(queryset, view.request, view=view)
    return pages.get_paginated_response(serializer_class(page, many=True, context={"request": view.request}).data)


def paginated_rows(view, rows: Rows, queryset_of, *, owner: int | None):
    """As ``paginated``, for a hot list of ``queryset_of(owner)``: the page is built from ``values()`` rows
    (portal.api.rows). The first page, when it holds the whole list (the common case), comes from the list's
    query compiled once (``Rows.first``); any other page is paginated as usual."""
    pages = Pages()
    request = view.request
    if request.query_params.get(pages.page_query_param, "1") == "1":
        size = pages.get_page_size(request)
        first = rows.first(queryset_of, owner=owner, limit=size + 1)
        if len(first) <= size:
            return Response({"count": len(first), "next": None, "previous": None, "results": rows.build(first)})
    page = pages.paginate_queryset(rows.values(queryset_of(owner)), request, view=view)
    return pages.get_paginated_response(rows.build(page))


def page_of(serializer_class):
    """The OpenAPI shape of a page of ``serializer_class`` items."""
    return inline_serializer(
        name=f"{serializer_class.__name__.removesuffix('Serializer')}Page",
        fields={
            "count": serializers.IntegerField(),
            "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True),
            "results": serializer_class(many=True),
        },
    )
