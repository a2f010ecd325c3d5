"""Settings: production refuses an insecure start; the API docs need a login outside development."""

import json
import os
import subprocess
import sys

import pytest
from django.conf import settings
from rest_framework.test import APIClient


def start_django(**env) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "SECRET_KEY")} | env
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import django, os; os.environ['DJANGO_SETTINGS_MODULE']='config.settings'; django.setup()",
        ],
        env=environment,
        capture_output=True,
        text=True,
        cwd=settings.BASE_DIR,
        timeout=60,
    )


@pytest.mark.parametrize("key", [None, "dev-only-insecure-key", "short"])
def test_production_refuses_to_start_without_a_real_secret_key(key):
    started = start_django(**({"SECRET_KEY": key} if key else {}))
    assert started.returncode != 0
    assert "SECRET_KEY must be set to a random value" in started.stderr


def test_production_starts_with_a_real_key_and_debug_is_off_unless_asked():
    started = start_django(SECRET_KEY="k" * 40)
    assert started.returncode == 0, started.stderr
    assert settings.DEBUG is False


def read_settings(*names: str, **env) -> dict:
    """The named settings of a Django started with ``env`` (and no SECRET_KEY, DEBUG or URLs of this run's)."""
    code = (
        "import django, json, os; os.environ['DJANGO_SETTINGS_MODULE']='config.settings'; django.setup(); "
        "from django.conf import settings as s; "
        f"print(json.dumps({{n: getattr(s, n) for n in {list(names)!r}}}, default=str))"
    )
    drop = ("DEBUG", "SECRET_KEY", "DATABASE_URL", "REDIS_URL", "DATABASE_PASSWORD", "REDIS_PASSWORD")
    environment = {k: v for k, v in os.environ.items() if k not in drop} | env
    done = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, cwd=settings.BASE_DIR, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_secrets_come_from_files_named_by_name_file_and_passwords_apart_from_their_urls(tmp_path):
    """The production stack's way (SECRETS_DIR): SECRET_KEY_FILE, DATABASE_PASSWORD_FILE, REDIS_PASSWORD_FILE and
    REGISTRY_PASSWORD_FILE, each file's one trailing newline dropped; the passwords win over any in the URLs."""
    files = {"key": "k" * 40 + "\n", "db": "d'b pw\n", "redis": "r@d:s/pw\n", "registry": "reg pw", "meta": "m:pw\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    read = read_settings(
        "SECRET_KEY",
        "DATABASES",
        "REDIS_URL",
        "CELERY_BROKER_URL",
        "REGISTRY_PASSWORD",
        "SHARED_FS_META",
        SECRET_KEY_FILE=str(tmp_path / "key"),
        DATABASE_URL="postgres://gpucloud_web:not-this@db.example:5432/gpucloud",
        DATABASE_PASSWORD_FILE=str(tmp_path / "db"),
        REDIS_URL="redis://redis.example:6379/0",
        REDIS_PASSWORD_FILE=str(tmp_path / "redis"),
        REGISTRY_PASSWORD_FILE=str(tmp_path / "registry"),
        SHARED_FS_META="postgres://jfs@db.example:5432/meta?sslmode=verify-full",
        SHARED_FS_META_PASSWORD_FILE=str(tmp_path / "meta"),
    )
    assert read["SECRET_KEY"] == "k" * 40
    database = read["DATABASES"]["default"]
    assert (database["USER"], database["PASSWORD"]) == ("gpucloud_web", "d'b pw")
    assert read["REDIS_URL"] == read["CELERY_BROKER_URL"] == "redis://:r%40d%3As%2Fpw@redis.example:6379/0"
    assert read["REGISTRY_PASSWORD"] == "reg pw"
    assert read["SHARED_FS_META"] == "postgres://jfs:m%3Apw@db.example:5432/meta?sslmode=verify-full"


def test_a_secret_file_that_is_missing_stops_the_start_naming_it(tmp_path):
    started = start_django(SECRET_KEY_FILE=str(tmp_path / "nowhere"))
    assert started.returncode != 0 and str(tmp_path / "nowhere") in started.stderr


def test_development_starts_with_the_dev_key_when_debug_is_on():
    assert start_django(DEBUG="true").returncode == 0


@pytest.mark.django_db
def test_the_api_schema_and_docs_need_a_login_outside_development(user):
    anonymous = APIClient()
    assert anonymous.get("/api/schema/").status_code in (401, 403)
    assert anonymous.get("/api/docs/").status_code in (401, 403)
    signed_in = APIClient()
    signed_in.force_authenticate(user)
    assert signed_in.get("/api/schema/").status_code == 200


@pytest.mark.django_db
def test_session_and_csrf_cookies_are_httponly_and_samesite(client, user):
    response = client.post("/login/", {"username": "alice", "password": "alice-pass-123"})
    session = response.cookies[settings.SESSION_COOKIE_NAME]
    assert session["httponly"] and session["samesite"] == "Lax"
