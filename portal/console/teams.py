"""Teams in the console: my teams and a new one; a team's wallet, members (admins manage them) and its work."""

from decimal import Decimal

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from billing import teams
from billing.services import budget_amount
from billing.statements import cost_so_far
from core.errors import ServiceError
from portal.console.shortcuts import or_404
from portal.models import Instance, Job
from scheduler.models import WorkloadStatus


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def team_list(request):
    if request.method == "POST":
        try:
            team = teams.team_create(user=request.user, name=request.POST.get("name", ""))
        except ServiceError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(request, _("Team %(name)s created; you are its admin.") % {"name": team.name})
            return redirect("console-team", slug=team.slug)
    mine = teams.teams_of(request.user)
    for team in mine:
        team.wallet = teams.team_wallet(team)
        team.member_count = team.memberships.count()
    return render(request, "portal/teams.html", {"teams": mine, "invitations": teams.invitations_of(request.user)})


@login_required
@require_POST
def team_invitation(request, invitation_id: int, answer: str):
    """The invited user's answer: ``accept`` (join the team) or ``decline``; anyone else's invitation is a 404."""
    if answer not in ("accept", "decline"):
        messages.error(request, _("Unknown action."))
        return redirect("console-teams")
    team = or_404(teams.invitation_answer, user=request.user, invitation_id=invitation_id, accept=answer == "accept")
    if answer == "accept":
        messages.success(request, _("You joined %(team)s.") % {"team": team.name})
        return redirect("console-team", slug=team.slug)
    messages.info(request, _("Invitation declined."))
    return redirect("console-teams")


@login_required
@require_safe
def team_detail(request, slug: str):
    team = or_404(teams.team_get, user=request.user, slug=slug)
    instances, jobs = (
        list(
            model.objects.filter(workload__team=team.slug)
            .exclude(workload__status=WorkloadStatus.RELEASED)
            .select_related("workload", "owner", "gpu_type")
        )
        for model in (Instance, Job)
    )
    costs = cost_so_far([w.workload_id for w in [*instances, *jobs]])
    for work in [*instances, *jobs]:
        work.cost = costs.get(work.workload_id)
    is_admin = teams.team_admin(team, request.user)
    context = {"team": team, "is_admin": is_admin, "instances": instances, "jobs": jobs, "stoppable": teams.STOPPABLE}
    context |= teams.team_summary(team)
    return render(request, "portal/team_detail.html", context)


def _limit(text: str) -> Decimal | None:
    try:
        return budget_amount(text, field="monthly_limit")  # the same rule as a wallet's budget
    except ServiceError:
        raise ServiceError(_("The monthly limit must be an amount (e.g. 300) or empty for none.")) from None


@login_required
@require_POST
def team_member(request, slug: str, action: str):
    """``add`` (invite, by username), ``update`` (admin flag, monthly limit) or ``remove`` a member: team admins
    only."""
    team = or_404(teams.team_get, user=request.user, slug=slug)
    post = request.POST
    member = post.get("member", "")
    member_id = int(member) if member.isascii() and member.isdigit() and len(member) < 19 else 0  # 0: no one
    try:
        if action == "add":
            username = post.get("username", "").strip()
            teams.member_invite(team=team, by=request.user, username=username)
            text = _("%(user)s is invited: if there is an account of that name, it joins the team once it accepts.")
            messages.success(request, text % {"user": username})
        elif action == "update":
            teams.member_update(
                team=team,
                by=request.user,
                member_id=member_id,
                is_admin=post.get("is_admin") == "on",
                monthly_limit=_limit(post.get("monthly_limit", "")),
            )
            messages.success(request, _("Member updated."))
        elif action == "remove":
            teams.member_remove(team=team, by=request.user, member_id=member_id)
            messages.info(request, _("Member removed."))
        else:
            messages.error(request, _("Unknown action."))
    except ServiceError as exc:
        messages.error(request, exc.message)
    return redirect("console-team", slug=team.slug)
