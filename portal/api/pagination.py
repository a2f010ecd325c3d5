"""Every list the API returns is paginated: ``?page=N&page_size=M`` (at most 200 a page)."""

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers
from rest_framework.pagination import PageNumberPagination


class Pages(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200


def paginated(view, queryset, serializer_class):
    """The page of ``queryset`` the request asks for, serialized, with count / next / previous."""
    pages = Pages()
    page = pages.paginate_queryset(queryset, view.request, view=view)
    return pages.get_paginated_response(serializer_class(page, many=True).data)


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
