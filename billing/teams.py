"""Teams: a shared wallet its members' work is charged to (as AutoDL's organisations, RunPod's teams).

Anyone may create a team and becomes its first admin; admins invite members by
username (the user joins when they accept: ``member_invite``, ``invitation_answer``;
the answer is the same whether such a user exists or not, so that it tells no one
which names have accounts), remove them, make them admins and set each member's
monthly limit. ``member_add`` adds at once: for operators (the admin) and tests.
Work is charged to a team when its owner picks the team at creation
(``Workload.team`` = the team's slug, which is also the scheduler's team for
quotas). Top-ups of a team's wallet are staff's, as for users.
"""

from decimal import Decimal

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils.text import slugify

from billing.enforcement import member_spend, standing
from billing.ledger import team_account
from billing.models import Membership, Team, TeamInvitation
from core.errors import Conflict, InvalidInput, NotFound
from core.powers import RUN_ANY_TEAM, VIEW_ANY_TEAM, holds
from portal.services import audit
from scheduler.models import Workload, WorkloadStatus
from scheduler.services.workloads import workload_stop

STOPPABLE = [WorkloadStatus.QUEUED, WorkloadStatus.STARTING, WorkloadStatus.RUNNING]  # what workload_stop takes


def teams_of(user):
    """The teams the user belongs to, with ``my_membership`` set on each."""
    memberships = Membership.objects.filter(user=user).select_related("team").order_by("team__name")
    teams = []
    for membership in memberships:
        membership.team.my_membership = membership
        teams.append(membership.team)
    return teams


def team_get(*, user, slug: str) -> Team:
    """A team the user is a member of (any, with VIEW_ANY_TEAM); NotFound otherwise, as if it did not exist."""
    team = Team.objects.filter(slug=slug).first()
    membership = Membership.objects.filter(team=team, user=user).first() if team else None
    if team is None or (membership is None and not holds(user, VIEW_ANY_TEAM)):
        raise NotFound("no such team")
    team.my_membership = membership
    return team


def _admin_member(team: Team) -> bool:
    """Whether the user ``team_get`` read it for is one of its admins."""
    return team.my_membership is not None and team.my_membership.is_admin


def team_admin(team: Team, user) -> bool:
    """Whether ``user`` may change ``team``'s members and limits: its admins, and RUN_ANY_TEAM."""
    return _admin_member(team) or holds(user, RUN_ANY_TEAM)


def _admin(team: Team, user) -> bool:
    """Conflict unless ``user`` may change the team; True when through RUN_ANY_TEAM, not as one of its admins:
    the caller then records what it did (``_audit``), once done."""
    if not team_admin(team, user):
        raise Conflict("only the team's admins may change its members")
    return not _admin_member(team)


def _audit(power: bool, *, team: Team, by, action: str, target: str) -> None:
    if power:
        audit.team_power_used(by=by, team=team.slug, action=action, target=target)


def team_create(*, user, name: str) -> Team:
    name = (name or "").strip()
    slug = slugify(name)[:64]
    if not name or len(name) > 128 or not slug or "\x00" in name:
        raise InvalidInput("give the team a name of 1 to 128 characters with a letter or digit", field="name")
    try:
        with transaction.atomic():
            team = Team.objects.create(slug=slug, name=name)
            Membership.objects.create(team=team, user=user, is_admin=True)
            team_account(team)
    except IntegrityError:
        raise InvalidInput(f"a team called {slug!r} exists already: choose another name", field="name") from None
    return team


def _active_user(username: str):
    """The active account called ``username`` (spaces around it ignored), or None."""
    username = (username or "").strip()
    if not username or len(username) > 150 or "\x00" in username:
        return None
    return get_user_model().objects.filter(username=username, is_active=True).first()


def member_add(*, team: Team, by, username: str, is_admin: bool = False) -> Membership:
    power = _admin(team, by)
    user = _active_user(username)
    if user is None:
        raise InvalidInput(f"no user called {username!r}", field="username")
    membership, created = Membership.objects.get_or_create(team=team, user=user, defaults={"is_admin": is_admin})
    if not created:
        raise Conflict(f"{user.username} is already a member")
    _audit(power, team=team, by=by, action="member-add", target=f"member {user.username}")
    return membership


def member_invite(*, team: Team, by, username: str) -> str:
    """Invite ``username`` to the team; what to tell the admin, the same whether that account exists or not."""
    power = _admin(team, by)
    username = (username or "").strip()
    if not username or len(username) > 150 or "\x00" in username:
        raise InvalidInput("give the username of the person to invite", field="username")
    user = _active_user(username)
    if user is not None:
        if Membership.objects.filter(team=team, user=user).exists():
            raise Conflict(f"{user.username} is already a member")  # the admin sees the members anyway
        TeamInvitation.objects.get_or_create(team=team, user=user, defaults={"invited_by": by})
    _audit(power, team=team, by=by, action="member-invite", target=f"member {username}")
    return f"{username} is invited: if there is an account of that name, it joins the team once it accepts"


def invitations_of(user) -> list[TeamInvitation]:
    """The invitations waiting for the user's answer, oldest first."""
    return list(TeamInvitation.objects.filter(user=user).select_related("team", "invited_by").order_by("created_at"))


def invitation_answer(*, user, invitation_id: int, accept: bool) -> Team:
    """Accept (join the team) or decline one of the user's invitations; NotFound for anyone else's."""
    with transaction.atomic():
        invitation = TeamInvitation.objects.select_for_update().filter(pk=invitation_id, user=user).first()
        if invitation is None:
            raise NotFound("no such invitation")
        if accept:
            Membership.objects.get_or_create(team=invitation.team, user=user)
        invitation.delete()
    return invitation.team


def member_update(*, team: Team, by, member_id: int, is_admin: bool, monthly_limit: Decimal | None) -> Membership:
    power = _admin(team, by)
    membership = Membership.objects.filter(team=team, pk=member_id).first()
    if membership is None:
        raise NotFound("no such member")
    if monthly_limit is not None and monthly_limit < 0:
        raise InvalidInput("a monthly limit is an amount of 0 or more, or empty for none", field="monthly_limit")
    if not is_admin and membership.is_admin and _admins(team) == 1:
        raise Conflict("a team keeps at least one admin")
    membership.is_admin, membership.monthly_limit = is_admin, monthly_limit
    membership.save(update_fields=["is_admin", "monthly_limit"])
    target = f"member {membership.user.username}"
    _audit(power, team=team, by=by, action="member-update", target=target)
    return membership


def member_remove(*, team: Team, by, member_id: int) -> None:
    power = _admin(team, by)
    membership = Membership.objects.filter(team=team, pk=member_id).first()
    if membership is None:
        raise NotFound("no such member")
    if membership.is_admin and _admins(team) == 1:
        raise Conflict("a team keeps at least one admin")
    membership.delete()
    _audit(power, team=team, by=by, action="member-remove", target=f"member {membership.user.username}")
    # Work the team pays for goes with the membership: left running, it would charge the team with no
    # monthly limit over it (the limit was the membership's). Their own work is theirs; starting the
    # stopped work again is refused (member_may_start).
    reason = f"stopped: {membership.user.username} left team {team.slug}, which paid for it"
    for workload in Workload.objects.filter(owner=membership.user, team=team.slug, status__in=STOPPABLE):
        try:
            workload_stop(workload, reason=reason)
        except Conflict:
            pass  # stopping already


def _admins(team: Team) -> int:
    return Membership.objects.filter(team=team, is_admin=True).count()


def team_wallet(team: Team) -> dict:
    """The team's account and its standing (balance, unsettled, available, month spend)."""
    account = team_account(team)
    return {"account": account, "standing": standing(account)}


def team_summary(team: Team) -> dict:
    """The wallet, and each member with their spend this month."""
    members = list(team.memberships.select_related("user").order_by("-is_admin", "user__username"))
    for membership in members:
        membership.month_spend = member_spend(membership)
    return {**team_wallet(team), "members": members}
