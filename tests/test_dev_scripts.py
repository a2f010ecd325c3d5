"""The development scripts make Celery's signing keys before any step that sends a signed message.

Creating a user sends one (its file-storage quota, when file storage is on): without the keys it
fails with ``SerializerNotInstalled: auth`` tracebacks, as ``make cluster`` printed on a fresh clone.
"""

import json
import os
import re
import socket
import subprocess
import uuid
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection

SCRIPTS = Path(settings.BASE_DIR) / "config" / "dev"


def _shell_function(script: Path, name: str) -> str:
    match = re.search(rf"^{name}\(\) \{{.*?^\}}$", script.read_text(), re.S | re.M)
    assert match, f"{script.name} has no function {name}"
    return match.group(0)


@pytest.mark.django_db(transaction=True)
def test_cluster_database_step_makes_the_keys_before_the_demo_users_send_messages(tmp_path):
    """cluster.sh's database_ready, run for real on a fresh key folder with file storage on (the cluster's roles,
    made by db_login_roles and granted by db_roles, are left out: the machine's PostgreSQL is shared)."""
    keys, calls = tmp_path / "keys", tmp_path / "calls"
    python = tmp_path / "python"
    python.write_text(
        f'#!/bin/sh\necho "$*" >>{calls}\ncase "$*" in *db_roles*) exit 0 ;; esac\n'
        f'exec {settings.BASE_DIR}/.venv/bin/python "$@"\n'
    )
    python.chmod(0o755)
    db = connection.settings_dict
    owner_url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    queue = f"dev-scripts-{uuid.uuid4().hex}"
    program = "\n".join(
        [
            "set -euo pipefail",
            _shell_function(SCRIPTS / "cluster.sh", "database_ready"),
            f"owner_url() {{ echo '{owner_url}'; }}",
            "db_login_roles() { :; }",
            f"PY={python} DB_OWNER=gpucloud WEB_DB_PASSWORD=x DIR={tmp_path}",
            "database_ready",
        ]
    )
    env = os.environ | {
        "KEYS_DIR": str(keys),
        "SHARED_FS_META": "postgres://gpucloud_fs@127.0.0.1:1/meta",  # on: a new user's quota is a message
        "SCHEDULER_QUEUE": queue,
    }
    try:
        done = subprocess.run(
            ["bash", "-c", program], cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=120
        )
        sent = redis.Redis.from_url(settings.REDIS_URL).llen(queue)
    finally:
        redis.Redis.from_url(settings.REDIS_URL).delete(queue)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert calls.read_text().splitlines()[0] == "manage.py make_signing_keys"
    assert (keys / "celery.key").exists()
    assert sent == 2  # demo's and admin's quota, signed


def test_run_script_makes_the_keys_before_its_first_other_manage_py_step():
    steps = re.findall(r"^\$PY (?:-m \S+|manage\.py \S+)", (SCRIPTS / "run.sh").read_text(), re.M)
    assert steps[0] == "$PY manage.py make_signing_keys", steps


def _settings_seen(env: dict) -> dict:
    """DEBUG, the database and Redis as a command typed in the checkout sees them."""
    code = "import json; from django.conf import settings as s; "
    code += "print(json.dumps([s.DEBUG, str(s.DATABASES['default']['NAME']), s.REDIS_URL, s.GPU_BACKEND]))"
    done = subprocess.run(
        [f"{settings.BASE_DIR}/.venv/bin/python", "manage.py", "shell", "-c", code],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(zip(["DEBUG", "database", "redis", "gpus"], json.loads(done.stdout.splitlines()[-1]), strict=True))


def test_a_command_typed_in_a_make_run_checkout_runs_as_make_run_does(tmp_path):
    """run.sh's write_run_env, run for real, then `manage.py shell` as a user types it (no SECRET_KEY, no DEBUG):
    it reads make run's settings, not the ones that stop it ("SECRET_KEY must be set ... when DEBUG is off")."""
    stack = {
        "RUN_DIR": str(tmp_path),
        "DEBUG": "true",
        "DATABASE_URL": f"sqlite:///{tmp_path}/my db.sqlite3",  # a space survives the file
        "REDIS_URL": "redis://127.0.0.1:6379/9",
        "GPU_BACKEND": "sim:2xRTX3090",
    }
    function = _shell_function(SCRIPTS / "run.sh", "write_run_env")
    subprocess.run(["bash", "-c", f"{function}\nwrite_run_env"], env={"PATH": os.environ["PATH"]} | stack, check=True)
    run_env = tmp_path / "run.env"
    assert run_env.stat().st_mode & 0o077 == 0  # it may hold SECRET_KEY: the owner's only
    typed = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "DEBUG", "DATABASE_URL", "REDIS_URL"}}
    typed |= {"RUN_ENV_FILE": str(run_env)}
    typed.pop("GPU_BACKEND", None)
    seen = _settings_seen(typed)
    assert seen == {
        "DEBUG": True,
        "database": f"{tmp_path}/my db.sqlite3",
        "redis": "redis://127.0.0.1:6379/9",
        "gpus": "sim:2xRTX3090",
    }
    # Tests and production set SECRET_KEY: the file is not theirs to read.
    assert _settings_seen(typed | {"SECRET_KEY": "k" * 40})["DEBUG"] is False


@pytest.mark.parametrize("which", ["web", "websocket"])
def test_make_run_stops_with_one_sentence_where_its_port_is_in_use(tmp_path, which):
    """run.sh for real, with something listening on its web port or on the WebSocket port after it: it says which
    port and what to do before it starts anything (not daphne's "Address already in use" traceback in a log)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        port = taken if which == "web" else taken - 1
        started = subprocess.run(
            ["bash", "config/dev/run.sh"],
            cwd=settings.BASE_DIR,
            env={"PATH": os.environ["PATH"], "PORT": str(port), "RUN_DIR": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert started.returncode == 1, started.stderr[-2000:]
    assert f"port {taken} is in use" in started.stderr
    assert "PORT=<another port> make run" in started.stderr
    assert not (tmp_path / "run.env").exists()  # nothing further ran


def _pg_paths(cluster_dir: Path, prefix: str) -> tuple[str, str]:
    function = _shell_function(SCRIPTS / "cluster.sh", "pg_paths")
    script = f'set -euo pipefail\nDIR="$1" LOG="$1/log" PREFIX="$2"\n{function}\npg_paths\n'
    script += 'echo "$PG_DATA"; echo "$PG_LOG"'
    done = subprocess.run(
        ["bash", "-c", script, "pg_paths", str(cluster_dir), prefix], capture_output=True, text=True, check=True
    )
    data, log = done.stdout.split()
    return data, log


def test_make_cluster_keeps_postgresql_where_the_postgres_user_can_reach_it(tmp_path):
    """A checkout under /root (mode 700) or in a `mktemp -d` folder: initdb ran as postgres and could not enter
    var/cluster (issue 32 §6). cluster.sh's pg_paths puts the data elsewhere then, and initdb succeeds there."""
    import shutil
    import tempfile

    private = tmp_path / "home"  # as /root: only its owner enters
    private.mkdir(mode=0o700)
    prefix = f"t{uuid.uuid4().hex[:6]}"
    data, log = _pg_paths(private / "checkout" / "var" / "cluster", prefix)
    assert data.startswith(f"/var/lib/gpucloud-cluster/{prefix}-") and log == f"{Path(data).parent}/postgres.log"
    try:
        subprocess.run(["install", "-d", "-o", "postgres", "-g", "postgres", "-m", "700", data], check=True)
        initdb = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))[-1]
        subprocess.run(["runuser", "-u", "postgres", "--", str(initdb), "-D", data], capture_output=True, check=True)
        assert (Path(data) / "PG_VERSION").exists()
    finally:
        shutil.rmtree(Path(data).parent)
    # A checkout postgres can enter keeps it in the cluster's own folder, as before.
    shared = Path(tempfile.mkdtemp())
    try:
        shared.chmod(0o755)
        assert _pg_paths(shared / "cluster", prefix) == (f"{shared}/cluster/pg", f"{shared}/cluster/log/postgres.log")
    finally:
        shutil.rmtree(shared)
