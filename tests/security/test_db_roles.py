"""Least-privilege PostgreSQL roles: a node agent's role reads no users, password hashes, tokens or sessions."""

import psycopg
import pytest

from tests.conftest import url_as

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("table", ["auth_user", "authtoken_token", "django_session", "portal_idempotencykey"])
def test_the_node_role_cannot_read_users_tokens_or_sessions(roles, table):
    with psycopg.connect(url_as(roles["node"], "node-pw")) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f"SELECT * FROM {table} LIMIT 1")


def test_the_node_role_reads_and_writes_what_an_agent_needs_and_cannot_change_the_schema(roles):
    with psycopg.connect(url_as(roles["node"], "node-pw")) as conn:
        conn.execute("SELECT status FROM scheduler_workload LIMIT 1")
        conn.execute("UPDATE scheduler_node SET last_heartbeat = last_heartbeat")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM scheduler_workload")
    with psycopg.connect(url_as(roles["web"], "web-pw")) as conn:
        conn.execute("SELECT count(*) FROM auth_user")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE mischief (id int)")
