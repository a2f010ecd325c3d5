"""The account page (API tokens: create with a name, revoke; password) and cloning an instance's settings."""

import pytest
from rest_framework.test import APIClient

from portal.models import ApiToken, Instance
from tests.portal.test_instance_api import create

pytestmark = pytest.mark.django_db


def created_key(response) -> str:
    """The key the page shows once, in its success message."""
    message = next(m for m in response.context["messages"] if m.level_tag == "success").message
    return next(word for word in message.split() if word.startswith("gpc_"))


def test_tokens_are_created_with_a_name_and_revoked_one_by_one_from_the_account_page(client, user, outsider):
    client.force_login(user)
    laptop = created_key(client.post("/account/token/create/", {"name": "laptop"}, follow=True))
    ci = created_key(client.post("/account/token/create/", {"name": "ci"}, follow=True))
    page = client.get("/account/").content.decode()
    assert "laptop" in page and laptop[:12] in page and laptop not in page, "the key is shown once, then its prefix"
    caller = APIClient()
    for key in (laptop, ci):
        caller.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        assert caller.get("/api/v1/me/").status_code == 200
    token = ApiToken.objects.get(user=user, name="laptop")
    client.force_login(outsider)
    assert "No such token" in client.post("/account/token/revoke/", {"token": token.pk}, follow=True).content.decode()
    client.force_login(user)
    client.post("/account/token/revoke/", {"token": token.pk})
    caller.credentials(HTTP_AUTHORIZATION=f"Token {laptop}")
    assert caller.get("/api/v1/me/").status_code == 403, "revoked"
    caller.credentials(HTTP_AUTHORIZATION=f"Token {ci}")
    assert caller.get("/api/v1/me/").status_code == 200, "the other token still works"
    assert client.post("/account/token/steal/").status_code == 404


def test_the_password_is_changed_from_the_account_page(client, user):
    client.force_login(user)
    response = client.post(
        "/account/password/",
        {"old_password": "alice-pass-123", "new_password1": "a-longer-secret-9", "new_password2": "a-longer-secret-9"},
    )
    assert response.status_code == 302
    user.refresh_from_db()
    assert user.check_password("a-longer-secret-9")


def test_a_clone_has_the_same_settings_and_an_outsider_gets_404(api, outsider_api, catalog, sim_node):
    source = create(api, catalog, gpus="0.5", cpu_cores=2, disk_gb=30, idle_util_percent=5).data["id"]
    response = api.post(f"/api/v1/instances/{source}/clone/")
    assert response.status_code == 201
    original, clone = Instance.objects.get(pk=source), Instance.objects.get(pk=response.data["id"])
    fields = [
        "image_id",
        "gpu_type_id",
        "gpus",
        "cpu_cores",
        "memory_gb",
        "disk_gb",
        "billing_mode",
        "idle_util_percent",
    ]
    assert [getattr(clone, f) for f in fields] == [getattr(original, f) for f in fields]
    assert clone.name == f"{original.name}-copy" and clone.workload_id != original.workload_id
    assert outsider_api.post(f"/api/v1/instances/{source}/clone/").status_code == 404
    assert Instance.objects.count() == 2
