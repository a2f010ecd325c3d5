"""Template context every page needs."""

from django.conf import settings


def websocket_url(request) -> dict:
    return {"websocket_url": settings.WEBSOCKET_URL}
