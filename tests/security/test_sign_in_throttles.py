"""Sign-in limits that a client cannot talk its way around: every sign-in door, and the address it counts by.

The address is the socket's peer unless settings.TRUSTED_PROXIES says how many
proxies in front of us append to X-Forwarded-For; then it is the entry the
nearest of them wrote, never one the client made up.
"""

import pytest
from django.test import Client
from rest_framework.test import APIClient
from rest_framework.throttling import SimpleRateThrottle

pytestmark = pytest.mark.django_db

WRONG = {"username": "alice", "password": "wrong-password"}


@pytest.fixture
def three_a_minute(monkeypatch, user):
    monkeypatch.setitem(SimpleRateThrottle.THROTTLE_RATES, "login", "3/min")


def console(forwarded_for: str, remote: str = "203.0.113.9") -> int:
    return Client(REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded_for).post("/login/", WRONG).status_code


def token(forwarded_for: str, remote: str = "203.0.113.9") -> int:
    client = APIClient(REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded_for)
    return client.post("/api/v1/auth/token/", WRONG, format="json").status_code


def admin(forwarded_for: str, remote: str = "203.0.113.9") -> int:
    return Client(REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded_for).post("/admin/login/", WRONG).status_code


@pytest.mark.parametrize("door", [console, token, admin], ids=["console", "api-token", "admin"])
def test_a_new_x_forwarded_for_per_attempt_does_not_reset_the_limit(door, three_a_minute):
    seen = [door(f"198.51.100.{i}") for i in range(5)]
    assert 429 not in seen[:3] and seen[3:] == [429, 429]


@pytest.mark.parametrize("door", [console, token, admin], ids=["console", "api-token", "admin"])
def test_behind_one_proxy_the_limit_counts_the_address_the_proxy_saw(door, three_a_minute, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    proxy = "10.0.0.2"  # every request reaches us from the proxy; it appends the client's address
    seen = [door(f"{i}.{i}.{i}.{i}, 198.51.100.7", remote=proxy) for i in range(1, 6)]  # made-up first entries
    assert 429 not in seen[:3] and seen[3:] == [429, 429]
    assert door("198.51.100.8", remote=proxy) != 429  # another client behind the same proxy has its own count


def test_the_admin_sign_in_is_refused_with_a_wait_once_throttled(three_a_minute):
    client = Client()
    for _ in range(3):
        client.post("/admin/login/", WRONG)
    refused = client.post("/admin/login/", {"username": "alice", "password": "alice-pass-123"})
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert "_auth_user_id" not in client.session  # the right password did not get in past the limit
