"""The tick's second connection (``scheduler.beside``): a step runs on a thread of its own with its own connection
where the tick's is not inside a transaction, at once on the caller's where it is."""

import threading

import pytest
from django.db import DatabaseError, connection, connections

from scheduler import beside
from scheduler.models import Node
from tests.conftest import make_node


def where_and_what() -> tuple[int, int, int]:
    """(this thread, its connection's PostgreSQL backend, the nodes it sees)."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    return threading.get_ident(), backend, Node.objects.count()


def backend() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_a_step_beside_runs_on_its_own_thread_and_connection_and_sees_what_is_committed():
    make_node("sim:4xRTX3090")
    thread, side, nodes = beside.beside(where_and_what).result()
    assert thread != threading.get_ident()
    assert side != backend()
    assert nodes == 1
    assert beside.beside(where_and_what).result()[0] == thread  # one side thread, step after step


@pytest.mark.django_db(transaction=True)
def test_an_error_beside_reaches_the_caller_and_the_next_step_runs():
    def fails():
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1 / 0")

    with pytest.raises(DatabaseError):
        beside.beside(fails).result()
    assert beside.beside(where_and_what).result()[2] == 0


@pytest.mark.django_db(transaction=True)
def test_close_closes_the_side_connection():
    _, first, _ = beside.beside(where_and_what).result()
    beside.close()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [first])
        assert cursor.fetchone()[0] == 0


@pytest.mark.django_db
def test_inside_a_transaction_a_step_runs_at_once_on_the_callers_connection_and_sees_its_rows():
    make_node("sim:4xRTX3090")  # not committed: the test's transaction is open
    thread, side, nodes = beside.beside(where_and_what).result()
    assert (thread, side, nodes) == (threading.get_ident(), backend(), 1)
    with pytest.raises(ZeroDivisionError):
        beside.beside(lambda: 1 / 0).result()
