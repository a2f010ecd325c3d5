"""Request rate limits, shared by the API, the console and the admin (DRF throttles on the shared Redis cache, so
every web worker counts together)."""

import hashlib

from rest_framework.throttling import SimpleRateThrottle, UserRateThrottle


class CreateRateThrottle(UserRateThrottle):
    """Creations per user (instances, jobs): POSTs only; reads are not limited by it."""

    scope = "create"

    def allow_request(self, request, view):
        if request.method != "POST":
            return True
        return super().allow_request(request, view)


class LoginRateThrottle(SimpleRateThrottle):
    """Sign-in attempts per client address and username (the console's login form)."""

    scope = "login"

    def get_cache_key(self, request, view):
        return self.key_for(request, request.POST.get("username"))

    def key_for(self, request, username) -> str:
        """Per address and username; the username digested, so no character of it reaches the cache key."""
        digest = hashlib.sha256(str(username or "").lower()[:150].encode()).hexdigest()[:24]
        return self.cache_format % {"scope": self.scope, "ident": f"{self.get_ident(request)}:{digest}"}


def sign_in_wait(request) -> int | None:
    """Seconds to wait when this sign-in attempt is past the limit (console or admin form); None: go on."""
    throttle = LoginRateThrottle()
    if throttle.allow_request(request, None):
        return None
    return int(throttle.wait() or 60)
