"""API tokens: made (the key shown once), looked up by their digest, revoked; and DRF's and Channels' door to them.

``Authorization: Token <key>`` as before, so the CLI, the SDK and scripts keep
working. Only ``sha256(key)`` is stored; a key ends at its expiry
(``API_TOKEN_DAYS``), when revoked, and when its user's password changes
(``portal.receivers``).
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rest_framework import authentication, exceptions

from core.errors import InvalidInput
from portal.models import ApiToken

KEY_PREFIX = "gpc_"  # tells a leaked key apart at a glance (secret scanners look for such prefixes)
SHOWN = 12  # characters of the key kept to tell tokens apart: the prefix and 8 random ones
MAX_PER_USER = 20  # each sign-in of the CLI makes one: beyond this, the oldest go
LAST_USED_EVERY = timedelta(minutes=5)  # last_used_at is written at most this often


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def token_create(*, user, name: str, days: int | None = None) -> tuple[ApiToken, str]:
    """A new token for ``user``; returns it and its key (the only time the key exists outside the client)."""
    name = (name or "").strip()
    if not name:
        raise InvalidInput("give the token a name (where it is used)", field="name")
    if len(name) > 64 or "\x00" in name:
        raise InvalidInput("at most 64 characters, and no NUL", field="name")
    days = settings.API_TOKEN_DAYS if days is None else days
    if not 1 <= days <= settings.API_TOKEN_DAYS:
        raise InvalidInput(f"must be 1 to {settings.API_TOKEN_DAYS} days", field="days")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = ApiToken.objects.create(
            user=user,
            name=name,
            prefix=key[:SHOWN],
            digest=digest(key),
            expires_at=timezone.now() + timedelta(days=days),
        )
        stale = ApiToken.objects.filter(user=user).order_by("-created_at", "-id").values_list("pk", flat=True)
        ApiToken.objects.filter(pk__in=list(stale[MAX_PER_USER:])).delete()
    return token, key


def token_list(*, user):
    return ApiToken.objects.filter(user=user, expires_at__gt=timezone.now())


def token_revoke(*, user, token_id: int) -> bool:
    """Revoke one of ``user``'s tokens; False when they have no such token."""
    return ApiToken.objects.filter(user=user, pk=token_id).delete()[0] > 0


def tokens_revoke_all(*, user_id: int) -> int:
    return ApiToken.objects.filter(user_id=user_id).delete()[0]


def token_user(key: str):
    """The active user a key belongs to, or None (unknown, revoked, expired, or the user is disabled)."""
    if not key or len(key) > 128:
        return None
    now = timezone.now()
    token = ApiToken.objects.select_related("user").filter(digest=digest(key), expires_at__gt=now).first()
    if token is None or not token.user.is_active:
        return None
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_EVERY:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user


class ApiTokenAuthentication(authentication.TokenAuthentication):
    """DRF's ``Authorization: Token <key>`` scheme, against the stored digests."""

    def authenticate_credentials(self, key):
        user = token_user(key)
        if user is None:
            raise exceptions.AuthenticationFailed("invalid or expired token")
        return user, None
