"""Time comes from the database: one clock for every machine of the cluster.

Liveness (heartbeats, lost nodes), transition deadlines and meter segments
compare times written by different machines, and any machine's own clock may be
off (a GPU host whose time sync died). So every such time is the database's:
writes use ``Now()`` (evaluated by the database server), comparisons use
``db_now()``. A node agent also keeps the offset between its own clock and the
database's, measured at each heartbeat (``AgentClock``), for the few times it
must take itself: the timestamps of its telemetry samples, and the moment it
stopped work while cut off from the control plane.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from django.db import connection
from django.utils import timezone


def db_now() -> datetime:
    """The database server's current time (this process's own clock on SQLite, a file on this host)."""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT STATEMENT_TIMESTAMP()")
        return cursor.fetchone()[0]


class AgentClock:
    """This process's clock, corrected by the offset to the database's clock last measured."""

    def __init__(self) -> None:
        self._offset_s = 0.0
        self._lock = threading.Lock()

    def measure(self) -> float:
        """Read the database's time and keep the offset (seconds the database is ahead of us)."""
        before = time.time()
        database = db_now().timestamp()
        after = time.time()
        with self._lock:
            self._offset_s = database - (before + after) / 2
        return self._offset_s

    @property
    def offset_s(self) -> float:
        with self._lock:
            return self._offset_s

    def time(self) -> float:
        """Now, as a Unix time on the database's clock."""
        return time.time() + self.offset_s

    def to_db(self, local_unix_time: float) -> datetime:
        """A moment read on this machine's clock, as the database's time."""
        return datetime.fromtimestamp(local_unix_time + self.offset_s, tz=UTC)


agent_clock = AgentClock()
