"""Small helpers shared by the console's views."""

from django.http import Http404

from core.errors import NotFound


def or_404(get, **kwargs):
    """``get(**kwargs)``, with the selectors' NotFound turned into a 404 page (as in the API: no hint it exists)."""
    try:
        return get(**kwargs)
    except NotFound as exc:
        raise Http404(exc.message) from exc
