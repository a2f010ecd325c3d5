"""Staff powers over other people's work are permissions, each use of them recorded (issue 31 §4).

Being staff gives none: support (the "Support" group) sees every tenant's work and acts on none of it,
operators ("Operators") also stop, release, grow, save and cancel it, and a job's environment — where
API keys live — is read with a permission of its own, only when asked for. Every such use is an
``AuditEntry``; an owner's own actions are not. (Route by route, for every role: the authorization matrix.)
"""

from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from rest_framework.test import APIClient

from portal.models import AuditEntry
from portal.services import work
from portal.services.requests import InstanceRequest, JobRequest
from scheduler.models import WorkloadStatus
from tests.conftest import staff_member

pytestmark = pytest.mark.django_db
SECRET = {"HF_TOKEN": "hf_secret_of_alice"}


def api_as(person) -> APIClient:
    client = APIClient()
    client.force_authenticate(person)
    return client


@pytest.fixture
def tenant_work(user, catalog, sim_node):
    common = dict(owner=user, name="x", image_id=catalog["image"].pk, gpu_type_id=catalog["rtx3090"].pk)
    common |= dict(gpus=Decimal("0.5"), cpu_cores=1, memory_gb=1)
    instance = work.instance_create(InstanceRequest(**common, disk_gb=10))
    job = work.job_create(JobRequest(**common, command="python train.py", env=SECRET))
    return instance, job


def test_plain_staff_see_no_tenants_work_and_support_see_it_but_act_on_none(tenant_work, django_user_model):
    instance, job = tenant_work
    plain = django_user_model.objects.create_user("clerk", is_staff=True)
    assert api_as(plain).get("/api/v1/instances/").json()["count"] == 0
    assert api_as(plain).get(f"/api/v1/jobs/{job.pk}/").status_code == 404

    support = api_as(staff_member(django_user_model, "sue", "Support"))
    assert support.get("/api/v1/instances/").json()["count"] == 1
    assert support.get(f"/api/v1/jobs/{job.pk}/").json()["command"] == "python train.py"
    refused = support.post(f"/api/v1/instances/{instance.pk}/stop/")
    assert refused.status_code == 403 and "scheduler.operate_any_work" in refused.json()["detail"]
    assert support.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 403
    job.workload.refresh_from_db()
    assert job.workload.status == WorkloadStatus.QUEUED and not AuditEntry.objects.exists()


def test_an_operators_actions_are_recorded_and_the_owners_own_are_not(tenant_work, user, django_user_model):
    instance, job = tenant_work
    operator = staff_member(django_user_model, "otto", "Operators")
    assert api_as(operator).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 202
    assert api_as(operator).post(f"/api/v1/instances/{instance.pk}/disk/", {"disk_gb": 20}).status_code == 202
    assert api_as(user).post(f"/api/v1/instances/{instance.pk}/stop/").status_code == 202
    entries = list(AuditEntry.objects.order_by("id").values_list("actor__username", "action", "target", "owner_id"))
    assert entries == [
        ("otto", "cancel", f"job {job.pk}", user.pk),
        ("otto", "grow-disk", f"instance {instance.pk}", user.pk),
    ]
    # A clone is its owner's only: it would be made from the instance's (perhaps private) image.
    assert api_as(operator).post(f"/api/v1/instances/{instance.pk}/clone/").status_code == 404


def test_a_jobs_environment_is_its_owners_and_read_by_others_only_when_asked_with_its_permission(
    tenant_work, user, django_user_model
):
    _, job = tenant_work
    detail = f"/api/v1/jobs/{job.pk}/"
    assert api_as(user).get(detail).json()["env"] == SECRET
    support = staff_member(django_user_model, "sue", "Support")
    assert api_as(support).get(detail).json()["env"] is None
    assert api_as(support).get(detail + "?env=1").json()["env"] is None  # asked, without the permission
    assert api_as(support).get("/api/v1/jobs/").json()["results"][0]["env"] is None
    assert not AuditEntry.objects.exists()

    reader = staff_member(django_user_model, "rita", "Support")
    reader.user_permissions.add(Permission.objects.get(codename="view_work_env"))
    assert api_as(reader).get(detail).json()["env"] is None  # not asked for: not shown, not recorded
    assert not AuditEntry.objects.exists()
    assert api_as(reader).get(detail + "?env=1").json()["env"] == SECRET
    assert list(AuditEntry.objects.values_list("actor__username", "action", "target")) == [
        ("rita", "read-env", f"job {job.pk}")
    ]
    assert api_as(reader).get("/api/v1/jobs/").json()["results"][0]["env"] is None  # never in a list

    # The console: a link to show it, then the page with it, recorded again.
    console = Client()
    console.force_login(reader)
    page = console.get(f"/jobs/{job.pk}/").content.decode()
    assert "data-reveal-env" in page and "hf_secret_of_alice" not in page
    shown = console.get(f"/jobs/{job.pk}/?env=1").content.decode()
    assert "HF_TOKEN=hf_secret_of_alice" in shown and AuditEntry.objects.count() == 2
    console.force_login(support)
    assert "hf_secret_of_alice" not in console.get(f"/jobs/{job.pk}/?env=1").content.decode()
    assert "data-reveal-env" not in console.get(f"/jobs/{job.pk}/").content.decode()


def test_the_admin_shows_a_workloads_environment_only_to_whoever_may_read_it(tenant_work, django_user_model):
    _, job = tenant_work
    viewer = django_user_model.objects.create_user("vic", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_workload"))
    console = Client()
    console.force_login(viewer)
    page = console.get(f"/admin/scheduler/workload/{job.workload_id}/change/")
    assert page.status_code == 200 and "hf_secret_of_alice" not in page.content.decode()
    viewer.user_permissions.add(Permission.objects.get(codename="view_work_env"))
    viewer = django_user_model.objects.get(pk=viewer.pk)  # permissions are cached on the object
    console.force_login(viewer)
    assert "hf_secret_of_alice" in console.get(f"/admin/scheduler/workload/{job.workload_id}/change/").content.decode()


def test_teams_are_seen_and_run_by_staff_only_with_the_billing_groups_permissions(user, django_user_model):
    from billing import teams
    from billing.models import TeamInvitation

    team = teams.team_create(user=user, name="lab")
    plain = Client()
    plain.force_login(django_user_model.objects.create_user("clerk", is_staff=True))
    assert plain.get(f"/teams/{team.slug}/").status_code == 404
    assert plain.post(f"/teams/{team.slug}/members/add/", {"username": "bob"}).status_code == 404
    billing = Client()
    billing.force_login(staff_member(django_user_model, "bill", "Billing"))
    assert billing.get(f"/teams/{team.slug}/").status_code == 200
    django_user_model.objects.create_user("bob")
    billing.post(f"/teams/{team.slug}/members/add/", {"username": "bob"})
    assert TeamInvitation.objects.filter(team=team, user__username="bob").exists()  # as the team's admin would
    entry = AuditEntry.objects.get()  # the staff member's change of a team they do not run; the admin's own: none
    assert (entry.actor.username, entry.team, entry.action, entry.target, entry.owner) == (
        "bill",
        team.slug,
        "member-invite",
        "member bob",
        None,
    )
    teams.member_invite(team=teams.team_get(user=user, slug=team.slug), by=user, username="carol")
    assert AuditEntry.objects.count() == 1
