"""The account page (API token create / replace / revoke, password) and cloning an instance's settings."""

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from portal.models import Instance
from tests.portal.test_instance_api import create

pytestmark = pytest.mark.django_db


def test_a_token_is_created_replaced_and_revoked_from_the_account_page(client, user):
    client.force_login(user)
    client.post("/account/token/create/")
    first = Token.objects.get(user=user).key
    assert first[:6] in client.get("/account/").content.decode()
    caller = APIClient()
    caller.credentials(HTTP_AUTHORIZATION=f"Token {first}")
    assert caller.get("/api/v1/me/").status_code == 200
    client.post("/account/token/create/")
    assert caller.get("/api/v1/me/").status_code == 403, "the replaced token stops working (Invalid token)"
    client.post("/account/token/revoke/")
    assert not Token.objects.filter(user=user).exists()
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
