"""Who makes the platform's PostgreSQL roles: the database server's superuser, never a role the platform logs in as.

CREATEROLE on PostgreSQL 15 is nearly a superuser (its holder may grant itself pg_execute_server_program and run
programs as the server), so the production database owner has none: the server's own script
(config/prod/images/postgres-roles.sh, run by its entrypoint at every start) makes the login roles, and
``manage.py db_roles``, run by the owner, only grants them their tables. Run here for real against this test
PostgreSQL, as its superuser over TCP instead of the container's local socket.
"""

import base64
import hashlib
import hmac
import subprocess
import uuid

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from tests.conftest import database_url, roles_script, url_as

pytestmark = pytest.mark.django_db(transaction=True)


def scram_matches(verifier: str, password: str) -> bool:
    """Whether a stored SCRAM-SHA-256 verifier (RFC 5802, as pg_authid keeps it) is ``password``'s."""
    scheme, rest = verifier.split("$", 1)
    iterations_salt, keys = rest.split("$")
    iterations, salt = iterations_salt.split(":")
    stored_key = keys.split(":")[0]
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt), int(iterations))
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    return scheme == "SCRAM-SHA-256" and hashlib.sha256(client_key).digest() == base64.b64decode(stored_key)


@pytest.fixture
def server(tmp_path):
    """Runs postgres-roles.sh on the test database with a fresh prefix and an owner that starts with CREATEROLE
    (as an older image made it); yields a run(env) function, and drops what it made."""
    prefix = f"gpur_{uuid.uuid4().hex[:6]}"
    owner = f"{prefix}_owner"
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE ROLE "{owner}" LOGIN CREATEROLE')

    def run(**env: str) -> subprocess.CompletedProcess:
        return roles_script(POSTGRES_USER=owner, DB_ROLES_PREFIX=prefix, **env)

    run.prefix, run.owner = prefix, owner
    yield run
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolname FROM pg_roles WHERE starts_with(rolname, %s) ORDER BY 1 DESC", [prefix])
        for (role,) in cursor.fetchall():
            cursor.execute(f'DROP OWNED BY "{role}"')  # db_roles' grants and policies, where a test ran it
            cursor.execute(f'DROP ROLE "{role}"')


def role_rows(prefix: str) -> dict[str, tuple]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT rolname, rolcanlogin, rolcreaterole, rolpassword FROM pg_authid WHERE starts_with(rolname, %s)",
            [prefix],
        )
        return {name: tuple(rest) for name, *rest in cursor.fetchall()}


def test_the_server_makes_the_login_roles_from_files_and_takes_createrole_from_the_owner(server, tmp_path):
    """Passwords with quotes and backslashes land exactly (checked against the stored SCRAM verifiers), from the
    environment or from a NAME_FILE; every host's role is in the group, with the idle-in-transaction limit."""
    roles_file = tmp_path / "db_node_roles"
    roles_file.write_text("gpu1=o'ne\\pw gpu-2=two-pw\n")
    done = server(DB_WEB_PASSWORD="we'b pw", DB_NODE_ROLES_FILE=str(roles_file), NODE_DB_IDLE_TX_S="17")
    assert done.returncode == 0, done.stderr
    rows = role_rows(server.prefix)
    web, group = f"{server.prefix}_web", f"{server.prefix}_node"
    gpu1, gpu2 = f"{group}_gpu1", f"{group}_gpu-2"
    assert rows[server.owner][:2] == (True, False)  # may log in, may no longer make roles
    assert rows[group][0] is False
    for role, password in ((web, "we'b pw"), (gpu1, "o'ne\\pw"), (gpu2, "two-pw")):
        can_login, creates_roles, verifier = rows[role]
        assert can_login and not creates_roles and scram_matches(verifier, password), role
    assert not scram_matches(rows[gpu2][2], "o'ne\\pw")  # the check itself can say no
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT r.rolname FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member "
            "JOIN pg_roles g ON g.oid = m.roleid WHERE g.rolname = %s ORDER BY 1",
            [group],
        )
        assert [row[0] for row in cursor.fetchall()] == [gpu2, gpu1]
        cursor.execute(
            "SELECT setrole::regrole::text, setconfig FROM pg_db_role_setting s JOIN pg_database d ON d.oid = "
            "s.setdatabase WHERE d.datname = current_database() AND starts_with(setrole::regrole::text, %s) "
            "ORDER BY 1",
            [f'"{group}'],
        )
        assert cursor.fetchall() == [(f'"{gpu2}"', ["idle_in_transaction_session_timeout=17s"])]
        cursor.execute("SELECT setconfig FROM pg_db_role_setting WHERE setrole = %s::regrole", [gpu1])
        assert cursor.fetchone() == (["idle_in_transaction_session_timeout=17s"],)


def test_a_host_taken_off_the_list_can_no_longer_log_in_and_its_sessions_end(server):
    assert server(DB_WEB_PASSWORD="w", DB_NODE_ROLES="gpu1=one gpu2=two").returncode == 0
    gpu1 = f"{server.prefix}_node_gpu1"
    # A session of gpu1's, open when the list changes (this machine's PostgreSQL trusts loopback: no password).
    url = database_url().replace("postgres://postgres@", f"postgres://{gpu1}@", 1)
    with psycopg.connect(url, autocommit=True) as session:
        assert session.execute("SELECT current_user").fetchone() == (gpu1,)
        done = server(DB_WEB_PASSWORD="w", DB_NODE_ROLES="gpu2=two")
        assert done.returncode == 0, done.stderr
        with pytest.raises(psycopg.OperationalError):
            session.execute("SELECT 1")
    rows = role_rows(server.prefix)
    assert rows[gpu1][0] is False and rows[f"{server.prefix}_node_gpu2"][0] is True
    with pytest.raises(psycopg.OperationalError, match="not permitted to log in"):
        psycopg.connect(url)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({}, "set DB_WEB_PASSWORD"),
        ({"DB_WEB_PASSWORD": "w", "DB_NODE_ROLES": "gpu1"}, "NAME=PASSWORD"),
        ({"DB_WEB_PASSWORD": "w", "DB_NODE_ROLES": 'gp"u=x'}, "is not a host name"),
        ({"DB_WEB_PASSWORD": "w", "DB_NODE_ROLES": "gpu1="}, "gpu1 has no password"),
        ({"DB_WEB_PASSWORD": "w", "DB_NODE_ROLES": "a" * 60 + "=x"}, "longer than 63 bytes"),
        ({"DB_WEB_PASSWORD": "w", "NODE_DB_IDLE_TX_S": "30; DROP"}, "NODE_DB_IDLE_TX_S"),
    ],
)
def test_bad_lists_are_refused_naming_what_is_wrong_and_nothing_is_made(server, env, says):
    done = server(**env)
    assert done.returncode != 0 and says in done.stderr
    assert f"{server.prefix}_web" not in role_rows(server.prefix)


def test_db_roles_makes_no_role_and_until_the_server_has_made_them_says_who_does(server):
    """db_roles only grants: run before the server's script it refuses, naming the script, and makes nothing;
    after it, the roles the script made log in and read their tables."""
    with pytest.raises(CommandError, match="postgres-roles.sh"):
        call_command("db_roles", prefix=server.prefix)
    assert set(role_rows(server.prefix)) == {server.owner}
    assert server(DB_WEB_PASSWORD="web-pw", DB_NODE_ROLES="gpu1=node-pw").returncode == 0
    call_command("db_roles", prefix=server.prefix)
    for role, password, table in (("web", "web-pw", "auth_user"), ("node_gpu1", "node-pw", "scheduler_node")):
        with psycopg.connect(url_as(f"{server.prefix}_{role}", password)) as conn:
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
