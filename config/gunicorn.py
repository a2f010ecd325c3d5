"""gunicorn settings for the web tier (HTTP only; WebSockets are daphne's).

Several processes use every core; threads let a worker overlap database waits
and keep connections alive. WEB_WORKERS / WEB_THREADS / WEB_BIND override.
"""

import multiprocessing
import os

bind = os.environ.get("WEB_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("WEB_WORKERS", 2 * multiprocessing.cpu_count() + 1))
worker_class = "gthread"
threads = int(os.environ.get("WEB_THREADS", 4))
keepalive = 5
timeout = 60
graceful_timeout = 20
accesslog = os.environ.get("WEB_ACCESS_LOG") or None
