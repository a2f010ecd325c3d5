"""Settings: production refuses an insecure start; the API docs need a login outside development."""

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
