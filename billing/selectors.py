"""Reads for money that the console, the admin and the API share."""

from __future__ import annotations

from django.contrib.auth import get_user_model

from billing.ledger import team_account, user_account
from billing.models import Account, Team
from scheduler.errors import InvalidInput


def payee_wallet(*, username: str = "", team: str = "") -> Account:
    """The wallet a top-up goes to: a user's (by username) or a team's (by slug); exactly one of them."""
    if bool(username) == bool(team):
        raise InvalidInput("give a username or a team, not both", field="username")
    if username:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise InvalidInput("no such user", field="username")
        return user_account(user)
    found = Team.objects.filter(slug=team).first()
    if found is None:
        raise InvalidInput("no such team", field="team")
    return team_account(found)
