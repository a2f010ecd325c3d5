"""Clients a process's threads share, each made once."""

import threading

import redis
from django.conf import settings

_lock = threading.Lock()
_redis: redis.Redis | None = None


def redis_client() -> redis.Redis:
    """The process's Redis client for its own keys (one thread-safe connection pool), made on first use.

    Made under a lock, not by ``functools.cache``: two threads that both miss that cache each make a
    client, the second's result replaces the first's in it, and the first client, freed then, closes its
    connection pool under the thread still using it (50 monitor sockets opening at once had their backfill
    reads fail so: "I/O operation on closed file", close code 1011).
    """
    global _redis
    with _lock:
        if _redis is None:
            _redis = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5)
        return _redis
