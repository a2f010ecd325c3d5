"""Small helpers shared by the console's views."""

from django.core.exceptions import PermissionDenied
from django.http import Http404

from core.errors import Forbidden, NotFound


def or_404(get, **kwargs):
    """``get(**kwargs)``, with the selectors' NotFound turned into a 404 page (as in the API: no hint it exists),
    and Forbidden (seen, but not the user's to act on: support staff) into a 403."""
    try:
        return get(**kwargs)
    except NotFound as exc:
        raise Http404(exc.message) from exc
    except Forbidden as exc:
        raise PermissionDenied(exc.message) from exc
