"""WSGI entry point: every HTTP request (pages, API, static files), served by gunicorn's workers.

WebSockets go to the ASGI server (config.asgi, daphne): a proxy routes ``/ws/`` there
in production; in development the page connects to ``WEBSOCKET_URL``.
"""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_wsgi_application()
