"""WSGI entry point: every HTTP request (pages, API, static files), served by gunicorn's workers.

WebSockets go to the ASGI server (config.asgi, daphne): a proxy routes ``/ws/`` there
in production; in development the page connects to ``WEBSOCKET_URL``.
"""

import gc
import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_wsgi_application()

# What start-up loads lives as long as the worker: the URL patterns loaded now (the views, serializers and
# the API's schema with them) instead of at the first request, then all of it kept out of the collector (as
# config.asgi does), whose full passes over it stalled a request now and then: the list's open-loop p99.
get_resolver().url_patterns  # noqa: B018 (loaded for its imports)
gc.freeze()
