"""Database work the tick runs beside its own, on a second connection: PostgreSQL executes one statement while
this process builds or reads another.

The tick spends about a quarter of its time waiting for PostgreSQL. Two of its steps need nothing of the steps
around them: the read of the holding rows (beside the queue's and the capacity's reads) and the accrual's write
(beside the placements' commits). ``beside`` runs such a step on one side thread, which keeps its own connection
from tick to tick (Django's connections are per thread). Where the tick's connection is inside a transaction (a
test's, which a second connection could not see into) or is SQLite's (one writer at a time), the step runs at once,
on the caller's thread. Either way ``.result()`` gives its value or raises its error.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from django.db import connection, connections

_pool: list = [None, None]  # (the process it was made in, its executor): a forked child makes its own
_lock = threading.Lock()


def beside(fn, *args, **kwargs) -> Future:
    """``fn(*args, **kwargs)`` on the side thread, or at once where it cannot run there (see the module's text)."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        done: Future = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as error:  # handed to whoever asks for the result, as the pool's thread does
            done.set_exception(error)
        return done
    return _executor().submit(_on_side_connection, fn, *args, **kwargs)


def _executor() -> ThreadPoolExecutor:
    with _lock:
        if _pool[0] != os.getpid():
            _pool[:] = [os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="tick-beside")]
        return _pool[1]


def _on_side_connection(fn, *args, **kwargs):
    side = connections["default"]
    side.close_if_unusable_or_obsolete()
    try:
        return fn(*args, **kwargs)
    except BaseException:
        side.close()  # a failed statement may leave it unusable; the next step opens a new one
        raise


def close() -> None:
    """Close the side thread's connection (it is opened again when next needed): before a database is dropped or
    copied, as ``connections.close_all()`` closes the calling thread's own."""
    with _lock:
        executor = _pool[1] if _pool[0] == os.getpid() else None
    if executor is not None:
        executor.submit(lambda: connections["default"].close()).result()
