"""The instance list's query compiled once per shape and prepared on PostgreSQL (portal.api.rows): the same
answer as the serializer, each user's own rows whatever shape was compiled first."""

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from portal import selectors
from portal.api.rows import Rows
from portal.api.serializers import InstanceOutput
from portal.api.views import InstanceListApi
from portal.models import Instance
from scheduler.models import Workload
from tests.conftest import staff_member
from tests.portal.test_instance_api import create

pytestmark = pytest.mark.django_db


def names(response) -> list[str]:
    assert response.status_code == 200, response.data
    return sorted(row["name"] for row in response.data["results"])


def test_each_user_lists_only_their_own_from_one_compiled_query(
    api, outsider_api, catalog, sim_node, django_user_model
):
    create(api, catalog, name="alices")
    create(outsider_api, catalog, name="mallorys")
    assert names(api.get("/api/v1/instances/")) == ["alices"]
    assert names(outsider_api.get("/api/v1/instances/")) == ["mallorys"]  # the shape alice's request compiled
    support = APIClient()
    support.force_authenticate(staff_member(django_user_model, "sue", "Support"))  # sees everyone's work
    assert names(support.get("/api/v1/instances/")) == ["alices", "mallorys"]
    assert names(api.get("/api/v1/instances/")) == ["alices"]


def test_a_later_page_and_a_short_page_are_paginated_as_before(api, catalog, sim_node):
    for n in range(3):
        create(api, catalog, name=f"i{n}")
    whole = api.get("/api/v1/instances/?page=1").data
    assert (whole["count"], whole["next"], whole["previous"]) == (3, None, None)
    short = api.get("/api/v1/instances/?page_size=2").data
    assert short["count"] == 3 and len(short["results"]) == 2 and short["next"].endswith("page=2&page_size=2")
    rest = api.get(short["next"]).data
    assert [r["name"] for r in short["results"] + rest["results"]] == [r["name"] for r in whole["results"]]


def test_the_rows_are_the_serializers_in_another_time_zone(api, catalog, sim_node, user):
    create(api, catalog)
    Workload.objects.update(started_at=timezone.now(), node=sim_node)
    with timezone.override("Asia/Shanghai"):
        listed = api.get("/api/v1/instances/").data["results"]
        assert listed == InstanceOutput(selectors.instance_list(user=user), many=True).data
    assert listed[0]["created_at"].endswith("+08:00")


def test_the_list_is_prepared_once_on_its_connection(api, catalog, sim_node):
    create(api, catalog)

    def prepared() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements WHERE statement LIKE '%%portal_instance%%'")
            return [row[0] for row in cursor.fetchall()]

    before = prepared()
    for _ in range(3):
        assert len(api.get("/api/v1/instances/").data["results"]) == 1
    assert len(prepared()) == len(before) + (0 if before else 1)  # prepared the first time, then reused


def test_a_query_that_does_not_filter_on_its_owner_once_is_refused(user):
    rows = Rows(InstanceOutput)
    with pytest.raises(ValueError, match="once"):
        rows.first(lambda owner: Instance.objects.all(), owner=user.pk, limit=5)
    with pytest.raises(ValueError, match="more than once"):
        rows.first(lambda owner: Instance.objects.filter(owner_id=owner, workload__owner_id=owner), owner=1, limit=5)


def test_the_view_compiles_one_query_per_shape(api, outsider_api, catalog, sim_node):
    compiled = InstanceListApi.rows._compiled
    compiled.clear()
    create(api, catalog)
    api.get("/api/v1/instances/")
    outsider_api.get("/api/v1/instances/")
    api.get("/api/v1/instances/?page_size=7")
    assert sorted((everyone, limit) for _, everyone, limit in compiled) == [(False, 8), (False, 51)]
