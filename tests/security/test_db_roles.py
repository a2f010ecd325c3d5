"""Least-privilege PostgreSQL roles: a node agent's role reads no users, password hashes, tokens or sessions."""

import uuid

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection

from tests.conftest import database_url

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def roles():
    if connection.vendor != "postgresql":
        pytest.fail("run on PostgreSQL (make test does)")
    prefix = f"gpuc_{uuid.uuid4().hex[:6]}"
    call_command("db_roles", prefix=prefix, web_password="web-pw", node_password="node-pw")
    yield {"web": f"{prefix}_web", "node": f"{prefix}_node"}
    with connection.cursor() as cursor:
        for role in (f"{prefix}_web", f"{prefix}_node"):
            cursor.execute(f'DROP OWNED BY "{role}"')
            cursor.execute(f'DROP ROLE "{role}"')


def url_as(role: str, password: str) -> str:
    rest = database_url().split("@", 1)[1]
    return f"postgres://{role}:{password}@{rest}"


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
