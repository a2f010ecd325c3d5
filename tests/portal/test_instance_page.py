"""The instance page: what it is, what it holds, its history; a stopped one says when housekeeping releases it."""

import pytest

from portal.models import Instance
from tests.conftest import wait_status
from tests.portal.test_instance_api import create

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_owner_sees_the_instance_its_cards_its_history_and_the_ways_in(api, client, user, catalog, node_worker):
    assert create(api, catalog, gpus="0.5").status_code == 201
    instance = Instance.objects.get()
    wait_status(instance.workload, "running", timeout=30)
    client.force_login(user)
    page = client.get(f"/instances/{instance.pk}/").content.decode()
    assert "Running" in page and "50%" in page and "12288 MiB" in page  # half an RTX 3090's memory
    assert f"/instances/{instance.pk}/terminal/" in page and f"/instances/{instance.pk}/files/" in page
    assert "queued → starting" in page.replace("&rarr;", "→") and "container running" in page
    assert api.post(f"/api/v1/instances/{instance.pk}/stop/").status_code == 202
    wait_status(instance.workload, "stopped", timeout=30)
    page = client.get(f"/instances/{instance.pk}/").content.decode()
    assert "will be released" in page and "/terminal/" not in page
