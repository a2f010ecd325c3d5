"""WebSocket authentication for scripts: ``Authorization: Token <key>`` on the handshake, for every ws/ route.

Browsers sign in with the session cookie, and the Origin check guards those sockets
against other sites (a page elsewhere cannot open one with the user's cookie). A
browser cannot set an Authorization header on a WebSocket, so a handshake that
carries one comes from a script (the CLI, the SDK): it is authenticated by its API
token alone — the cookie is ignored and no Origin is needed. A wrong, expired or revoked
token is anonymous, which every consumer refuses (4401) as it refuses the signed out.
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.contrib.auth.models import AnonymousUser

from portal.services.tokens import token_user

SCHEME = "token"


def token_key(scope) -> str | None:
    """The key of an ``Authorization: Token <key>`` header; None when there is no such header."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, key = value.decode("latin1").strip().partition(" ")
            if scheme.lower() == SCHEME:
                return key.strip()
    return None


@database_sync_to_async
def _user_of(key: str):
    return token_user(key) or AnonymousUser()


class TokenAuthMiddleware:
    """``browser_app`` (Origin check + session) for cookie handshakes; ``token_app`` with the token's user otherwise."""

    def __init__(self, browser_app, token_app):
        self.browser_app, self.token_app = browser_app, token_app

    async def __call__(self, scope, receive, send):
        key = token_key(scope)
        if key is None:
            return await self.browser_app(scope, receive, send)
        user = await _user_of(key) if key else AnonymousUser()
        return await self.token_app({**scope, "user": user}, receive, send)
