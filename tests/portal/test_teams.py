"""Teams: create one, invite members (they accept), charge work to the team's wallet, limits per member, privacy."""

from decimal import Decimal

import pytest
from django.test import Client

from billing.ledger import team_account, wallet_credit
from billing.models import Membership, PostingKind, Team, TeamInvitation
from portal.models import Instance
from tests.conftest import wait_for, wait_status
from tests.portal.test_instance_api import create

pytestmark = pytest.mark.django_db(transaction=True)


def console(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def messages_of(response) -> str:
    return " ".join(str(m) for m in response.context["messages"])


def join(admin: Client, member, slug: str) -> None:
    """The team's admin invites ``member``, who accepts on their teams page."""
    admin.post(f"/teams/{slug}/members/add/", {"username": member.username})
    invitation = TeamInvitation.objects.get(team__slug=slug, user=member)
    joined = console(member).post(f"/teams/invitations/{invitation.pk}/accept/", follow=True)
    assert "You joined" in messages_of(joined), messages_of(joined)


def test_a_team_is_created_members_are_added_and_work_is_charged_to_its_wallet(
    api, user, outsider, outsider_api, catalog, node_worker
):
    admin = console(user)
    created = admin.post("/teams/", {"name": "Vision Lab"}, follow=True)
    assert "Team Vision Lab created" in messages_of(created)
    team = Team.objects.get(slug="vision-lab")
    invited = admin.post("/teams/vision-lab/members/add/", {"username": outsider.username}, follow=True)
    assert f"{outsider.username} is invited" in messages_of(invited)
    assert not Membership.objects.filter(team=team, user=outsider).exists(), "not a member before accepting"
    join(admin, outsider, "vision-lab")
    wallet_credit(account=team_account(team), amount=Decimal("100"), kind=PostingKind.TOPUP, memo="t", by=None)

    # The member picks the team when creating: the team's wallet pays.
    response = create(outsider_api, catalog, name="team-run", team="vision-lab")
    assert response.status_code == 201, response.data
    assert response.data["team"] == "vision-lab"
    instance = Instance.objects.get(name="team-run")
    wait_status(instance.workload, "running")
    segment = wait_for(lambda: instance.workload.meter_segments.filter(account__isnull=False).first(), what="payer")
    assert segment.account == team_account(team)
    assert outsider_api.post(f"/api/v1/instances/{instance.pk}/stop/").status_code == 202
    wait_status(instance.workload, "stopped")
    charged = wait_for(lambda: segment.postings.first(), what="the stop settled")
    assert charged.debit == team_account(team) and charged.amount > 0

    page = admin.get("/teams/vision-lab/").content.decode()
    assert 'data-team-work="team-run"' in page and f'data-member="{outsider.username}"' in page
    member_page = console(outsider).get("/teams/vision-lab/").content.decode()
    assert 'data-team-work="team-run"' in member_page and "data-add-member" not in member_page  # no admin forms

    # Not a member: refused naming the field; a member past a limit: 402.
    stranger = create(api, catalog, name="x", team="no-such-team")
    assert stranger.status_code == 400 and "team" in stranger.data
    membership = Membership.objects.get(team=team, user=outsider)
    admin.post("/teams/vision-lab/members/update/", {"member": membership.pk, "monthly_limit": "0"})
    membership.refresh_from_db()
    assert membership.monthly_limit == Decimal("0")
    limited = create(outsider_api, catalog, name="y", team="vision-lab")
    assert limited.status_code == 402 and "limit" in str(limited.data)


def test_only_admins_change_members_outsiders_see_nothing_and_a_team_keeps_an_admin(user, outsider, django_user_model):
    admin = console(user)
    admin.post("/teams/", {"name": "NLP"})
    third = django_user_model.objects.create_user("third", password="third-pass-123")
    assert console(outsider).get("/teams/nlp/").status_code == 404
    assert console(outsider).post("/teams/nlp/members/add/", {"username": "third"}).status_code == 404
    join(admin, outsider, "nlp")
    refused = console(outsider).post("/teams/nlp/members/add/", {"username": "third"}, follow=True)
    assert "only the team's admins" in messages_of(refused)
    assert not Membership.objects.filter(user=third).exists()
    mine = Membership.objects.get(team__slug="nlp", user=user)
    last_admin = admin.post("/teams/nlp/members/remove/", {"member": mine.pk}, follow=True)
    assert "keeps at least one admin" in messages_of(last_admin)
    taken = admin.post("/teams/", {"name": "nlp"}, follow=True)
    assert "exists already" in messages_of(taken)


def test_a_removed_member_s_team_work_stops_and_their_own_goes_on(api, user, outsider, outsider_api, catalog, sim_node):
    admin = console(user)
    admin.post("/teams/", {"name": "NLP"})
    join(admin, outsider, "nlp")
    team = Team.objects.get(slug="nlp")
    wallet_credit(account=team_account(team), amount=Decimal("100"), kind=PostingKind.TOPUP, memo="t", by=None)
    team_run = create(outsider_api, catalog, name="team-run", team="nlp")
    own_run = create(outsider_api, catalog, name="own-run")
    assert team_run.status_code == own_run.status_code == 201  # queued: no worker here
    membership = Membership.objects.get(team__slug="nlp", user=outsider)
    admin.post("/teams/nlp/members/remove/", {"member": membership.pk})
    team_work = Instance.objects.get(name="team-run").workload
    assert team_work.status == "stopped" and "left team nlp" in team_work.events.last().reason
    assert Instance.objects.get(name="own-run").workload.status == "queued", "their own wallet's work is theirs"
    start = outsider_api.post(f"/api/v1/instances/{team_run.data['id']}/start/")
    assert start.status_code == 402 and "not a member of team nlp" in start.data["detail"], "no limit left to keep"


def test_a_team_admin_stops_work_charged_to_the_team_and_nothing_else_of_a_member(
    api, user, outsider, outsider_api, catalog, sim_node, django_user_model
):
    admin = console(user)
    admin.post("/teams/", {"name": "CV"})
    join(admin, outsider, "cv")
    wallet_credit(
        account=team_account(Team.objects.get(slug="cv")), amount=Decimal(100), kind="topup", memo="t", by=None
    )
    team_run = create(outsider_api, catalog, name="team-run", team="cv").data["id"]
    own_run = create(outsider_api, catalog, name="own-run").data["id"]
    page = admin.get("/teams/cv/").content.decode()
    assert f'action="/instances/{team_run}/stop/"' in page, "the admin's team page has a Stop button"
    assert api.post(f"/api/v1/instances/{own_run}/stop/").status_code == 404, "a member's own work is theirs"
    assert api.post(f"/api/v1/instances/{team_run}/release/").status_code == 404, "stop only: not release"
    stopped = api.post(f"/api/v1/instances/{team_run}/stop/")
    assert stopped.status_code == 202 and stopped.data["status"] == "stopped"
    assert api.get(f"/api/v1/instances/{team_run}/").status_code == 404, "stopping it shows nothing more of it"

    second = create(outsider_api, catalog, name="second", team="cv").data["id"]
    member = django_user_model.objects.create_user("pat", password="pat-pass-123")
    join(admin, member, "cv")
    assert console(member).post(f"/instances/{second}/stop/").status_code == 404, "members who are not admins: no"
    admin.post(f"/instances/{second}/stop/", {"next": "/teams/cv/"})
    assert Instance.objects.get(pk=second).workload.status == "stopped"


def test_an_invitation_tells_no_one_which_usernames_exist_and_joins_only_with_consent(
    user, outsider, django_user_model
):
    """Issue 31 §4: admins added any username without its owner's consent, and the error confirmed which names
    had accounts. Now the answer is the same for any name, and only the invited user can accept."""
    admin = console(user)
    admin.post("/teams/", {"name": "NLP"}, follow=True)
    real = messages_of(admin.post("/teams/nlp/members/add/", {"username": outsider.username}, follow=True))
    made_up = messages_of(admin.post("/teams/nlp/members/add/", {"username": "no-such-person"}, follow=True))
    assert real.replace(outsider.username, "X") == made_up.replace("no-such-person", "X")
    assert not Membership.objects.filter(user=outsider).exists()
    invitation = TeamInvitation.objects.get(user=outsider)
    assert list(TeamInvitation.objects.values_list("user__username", flat=True)) == [outsider.username]

    third = django_user_model.objects.create_user("third", password="third-pass-123")
    assert console(third).post(f"/teams/invitations/{invitation.pk}/accept/").status_code == 404, "not theirs"
    page = console(outsider).get("/teams/").content.decode()
    assert 'data-invitation="nlp"' in page
    declined = console(outsider).post(f"/teams/invitations/{invitation.pk}/decline/", follow=True)
    assert "declined" in messages_of(declined)
    assert not TeamInvitation.objects.exists() and not Membership.objects.filter(user=outsider).exists()
    assert console(outsider).get("/teams/nlp/").status_code == 404
