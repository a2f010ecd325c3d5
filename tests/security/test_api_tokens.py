"""API tokens: only a digest is stored, each has a name and an expiry, and a new password ends them all."""

import hashlib
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from portal.models import ApiToken
from portal.services.tokens import token_create

pytestmark = pytest.mark.django_db


def me(key: str) -> int:
    caller = APIClient()
    caller.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return caller.get("/api/v1/me/").status_code


def test_the_database_holds_no_usable_key(user):
    response = APIClient().post(
        "/api/v1/auth/token/", {"username": "alice", "password": "alice-pass-123", "name": "laptop"}, format="json"
    )
    assert response.status_code == 200
    key = response.data["token"]
    assert me(key) == 200
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM portal_apitoken")
        stored = [str(value) for row in cursor.fetchall() for value in row]
    assert key not in stored and hashlib.sha256(key.encode()).hexdigest() in stored
    token = ApiToken.objects.get(user=user)
    assert token.name == "laptop" and key.startswith(token.prefix)
    assert response.data["name"] == "laptop" and response.data["expires_at"]


def test_a_token_stops_working_when_it_expires(user, settings):
    token, key = token_create(user=user, name="ci")
    assert timedelta(days=settings.API_TOKEN_DAYS - 1) < token.expires_at - timezone.now()
    assert me(key) == 200
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert me(key) == 403


def test_a_password_change_from_the_account_page_revokes_every_token(client, user):
    _, laptop = token_create(user=user, name="laptop")
    _, ci = token_create(user=user, name="ci")
    client.force_login(user)
    new = "a-longer-secret-9"
    response = client.post(
        "/account/password/", {"old_password": "alice-pass-123", "new_password1": new, "new_password2": new}
    )
    assert response.status_code == 302
    assert (me(laptop), me(ci)) == (403, 403)
    assert client.get("/account/").status_code == 200, "the session that changed it stays signed in"


def test_a_password_set_anywhere_else_revokes_them_too_but_a_rehash_of_the_same_one_does_not(user):
    _, key = token_create(user=user, name="script")
    user.set_password("alice-pass-123")  # the same password, hashed again (as a hasher upgrade does)
    user.save(update_fields=["password"])
    assert me(key) == 200
    user.set_password("an-admin-chose-this-1")
    user.save()
    assert me(key) == 403


def test_a_disabled_user_s_token_is_refused(user):
    _, key = token_create(user=user, name="x")
    user.is_active = False
    user.save(update_fields=["is_active"])
    assert me(key) == 403


@pytest.mark.parametrize("weak", ["password", "12345678901", "alice.99", "short"])
def test_weak_passwords_are_refused(client, user, weak):
    client.force_login(user)
    response = client.post(
        "/account/password/", {"old_password": "alice-pass-123", "new_password1": weak, "new_password2": weak}
    )
    assert response.status_code == 200 and response.context["form"].errors["new_password2"]
    user.refresh_from_db()
    assert user.check_password("alice-pass-123")


def test_a_user_keeps_a_bounded_number_of_tokens(user):
    from portal.services.tokens import MAX_PER_USER

    keys = [token_create(user=user, name=f"login {n}")[1] for n in range(MAX_PER_USER + 2)]
    assert ApiToken.objects.filter(user=user).count() == MAX_PER_USER
    assert me(keys[0]) == 403 and me(keys[-1]) == 200, "the oldest went"
