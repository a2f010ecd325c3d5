"""High priority jumps the queue: only users an administrator allows may ask for it (issue 32 §6).

The permission ``scheduler.submit_high_priority`` (superusers hold every permission; an administrator gives it
to a user or a group in the admin). Normal and low are everyone's. Refused at the priority field, nothing made.
"""

import pytest
from django.test import Client

from portal.models import Job, JobArray
from scheduler.models import Priority, Workload
from tests.portal.test_arrays import body
from tests.portal.test_console import job_form

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("path", ["/api/v1/jobs/", "/api/v1/arrays/"])
def test_high_priority_is_refused_at_its_field_to_a_user_not_allowed_it(api, catalog, sim_node, path):
    extra = {"array": "0-3"} if "arrays" in path else {}
    response = api.post(path, body(catalog, priority="high", **extra), format="json")
    assert response.status_code == 400, response.data
    assert "priority" in response.data and "administrator" in str(response.data["priority"])
    assert not Workload.objects.exists() and not Job.objects.exists() and not JobArray.objects.exists()


def test_normal_and_low_are_everyones(api, catalog, sim_node):
    for priority in ("normal", "low"):
        response = api.post("/api/v1/jobs/", body(catalog, priority=priority), format="json")
        assert response.status_code == 201, response.data
    assert sorted(Workload.objects.values_list("priority", flat=True)) == [Priority.NORMAL, Priority.LOW]


@pytest.mark.parametrize("path", ["/api/v1/jobs/", "/api/v1/arrays/"])
def test_a_user_given_the_permission_submits_high(api, catalog, sim_node, may_submit_high, path):
    extra = {"array": "0-1"} if "arrays" in path else {}
    response = api.post(path, body(catalog, priority="high", **extra), format="json")
    assert response.status_code == 201, response.data
    assert set(Workload.objects.values_list("priority", flat=True)) == {Priority.HIGH}


def test_a_group_holding_the_permission_allows_its_members(api, user, catalog, sim_node):
    from django.contrib.auth.models import Group, Permission

    leads = Group.objects.create(name="team-leads")
    leads.permissions.add(Permission.objects.get(codename="submit_high_priority"))
    user.groups.add(leads)
    assert api.post("/api/v1/jobs/", body(catalog, priority="high"), format="json").status_code == 201


def test_the_console_offers_high_only_to_those_allowed(user, django_user_model, catalog, sim_node):
    console = Client()
    console.force_login(user)
    page = console.get("/jobs/new/").content.decode()
    assert 'value="1"' in page and '<option value="0"' not in page
    refused = console.post("/jobs/new/", job_form(catalog, priority=0)).content.decode()
    assert 'data-field="priority"' in refused and not Workload.objects.exists()

    admin = django_user_model.objects.create_superuser("root", password="root-pass-123")
    console.force_login(admin)
    assert '<option value="0"' in console.get("/jobs/new/").content.decode()
    assert console.post("/jobs/new/", job_form(catalog, priority=0)).status_code == 302
    assert Workload.objects.get().priority == Priority.HIGH
