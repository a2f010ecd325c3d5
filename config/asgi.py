"""ASGI entry point: HTTP through Django, WebSocket through Channels (session cookie, or an API token:
portal/sockets/auth.py)."""

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from portal.sockets.auth import TokenAuthMiddleware  # noqa: E402
from portal.sockets.routing import websocket_urlpatterns  # noqa: E402

sockets = URLRouter(websocket_urlpatterns)

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": TokenAuthMiddleware(AllowedHostsOriginValidator(AuthMiddlewareStack(sockets)), sockets),
    }
)

# What start-up loaded (Django, Channels, Twisted: ~150,000 objects) lives as long as the process: kept out
# of the collector, whose full passes over it took 80-250 ms on a busy host — a stall in every open terminal.
gc.freeze()
