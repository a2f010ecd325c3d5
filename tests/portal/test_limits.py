"""Bounded inputs: paginated lists, a queued-work limit per user, rate limits on sign-in and creation."""

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.throttling import SimpleRateThrottle

from portal.models import Instance
from tests.portal.test_instance_api import create

pytestmark = pytest.mark.django_db


def test_lists_are_paginated(api, catalog, sim_node):
    for _ in range(3):
        assert create(api, catalog).status_code == 201
    page = api.get("/api/v1/instances/?page_size=2").data
    assert page["count"] == 3 and len(page["results"]) == 2 and page["next"]
    assert len(api.get(page["next"]).data["results"]) == 1
    assert api.get("/api/v1/instances/?page=9").status_code == 404


def test_queued_work_per_user_is_limited_with_a_sentence(api, outsider_api, catalog, sim_node, settings):
    settings.MAX_QUEUED_PER_USER = 2  # no worker runs here: everything created stays queued
    assert [create(api, catalog).status_code for _ in range(2)] == [201, 201]
    refused = create(api, catalog)
    assert refused.status_code == 429
    assert "waiting in the queue (the limit is 2)" in refused.data["detail"]
    assert Instance.objects.filter(owner__username="alice").count() == 2
    assert create(outsider_api, catalog).status_code == 201  # a limit per user, not for everyone


def test_creating_too_fast_is_throttled(api, catalog, sim_node, monkeypatch):
    monkeypatch.setitem(SimpleRateThrottle.THROTTLE_RATES, "create", "2/min")
    assert [create(api, catalog).status_code for _ in range(3)] == [201, 201, 429]
    assert api.get("/api/v1/instances/").status_code == 200  # reading is not creating


def test_sign_in_attempts_are_throttled_per_address_and_username(user, monkeypatch):
    monkeypatch.setitem(SimpleRateThrottle.THROTTLE_RATES, "login", "3/min")
    client = Client()
    wrong = {"username": "alice", "password": "wrong"}
    assert [client.post("/login/", wrong).status_code for _ in range(3)] == [200, 200, 200]
    refused = client.post("/login/", {"username": "alice", "password": "alice-pass-123"})
    assert refused.status_code == 429 and "Too many sign-in attempts" in refused.content.decode()
    assert client.post("/login/", {"username": "bob", "password": "x"}).status_code == 200


def test_listing_costs_the_same_queries_for_one_instance_or_twenty(api, catalog, sim_node):
    def queries_for_list() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert api.get("/api/v1/instances/").status_code == 200
        return len(captured)

    create(api, catalog)
    one = queries_for_list()
    for _ in range(19):
        create(api, catalog)
    assert queries_for_list() == one <= 3  # the page and its count: no query per instance


def test_the_fast_list_answers_exactly_what_the_serializer_would(api, catalog, sim_node, user):
    from portal import selectors
    from portal.api.rows import Rows
    from portal.api.serializers import InstanceOutput
    from scheduler.models import Workload

    create(api, catalog)
    create(api, catalog, billing_mode="spot", gpus="1")
    Workload.objects.filter(pk=Workload.objects.first().pk).update(node=sim_node, exit_code=3, queue_position=2)
    listed = api.get("/api/v1/instances/").data["results"]
    queryset = selectors.instance_list(user=user)
    assert listed == InstanceOutput(queryset, many=True).data
    assert Rows(InstanceOutput).build(Rows(InstanceOutput).values(queryset)) == listed
