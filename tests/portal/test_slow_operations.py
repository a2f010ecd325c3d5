"""Per-user concurrency of slow operations: saving and deleting images, growing disks, moving and
restarting instances.

Every tenant shares each node's slow queue; one user may have at most MAX_SLOW_OPERATIONS_PER_USER of
them under way at once, and one more is refused (429) saying so.
"""

import pytest

from portal.models import Image, ImageStatus
from scheduler.models import Workload, WorkloadStatus
from tests.conftest import make_node
from tests.portal.test_operation_deadlines import stopped_instance

pytestmark = pytest.mark.django_db


@pytest.fixture
def three(user, catalog, settings):
    settings.MAX_SLOW_OPERATIONS_PER_USER = 2
    node = make_node("sim:3xRTX3090")
    return [stopped_instance(user, catalog, node) for _ in range(3)]


def test_a_user_cannot_have_more_slow_operations_under_way_than_the_limit(api, three):
    first, second, third = three
    assert api.post(f"/api/v1/instances/{first.pk}/save-image/", {"name": "a"}, format="json").status_code == 202
    assert api.post(f"/api/v1/instances/{second.pk}/disk/", {"disk_gb": 20}, format="json").status_code == 202

    refused = api.post(f"/api/v1/instances/{third.pk}/save-image/", {"name": "c"}, format="json")
    assert refused.status_code == 429
    assert "2 slow operations under way" in refused.data["detail"] and "the limit is 2" in refused.data["detail"]
    assert api.post(f"/api/v1/instances/{third.pk}/disk/", {"disk_gb": 20}, format="json").status_code == 429
    assert api.post(f"/api/v1/instances/{third.pk}/move/").status_code == 429
    Workload.objects.filter(pk=third.workload_id).update(status=WorkloadStatus.RUNNING)
    assert api.post(f"/api/v1/instances/{third.pk}/restart/").status_code == 429
    Workload.objects.filter(pk=third.workload_id).update(status=WorkloadStatus.STOPPED)
    assert not Image.objects.filter(source_instance=third).exists()

    Image.objects.filter(source_instance=first).update(status=ImageStatus.READY)  # its node answered
    assert api.post(f"/api/v1/instances/{third.pk}/save-image/", {"name": "c"}, format="json").status_code == 202


def test_other_users_are_not_held_back_by_ones_limit(api, three, outsider, catalog):
    first, second, _ = three
    api.post(f"/api/v1/instances/{first.pk}/save-image/", {"name": "a"}, format="json")
    api.post(f"/api/v1/instances/{second.pk}/save-image/", {"name": "b"}, format="json")
    theirs = stopped_instance(outsider, catalog)
    api.force_authenticate(outsider)

    assert api.post(f"/api/v1/instances/{theirs.pk}/save-image/", {"name": "x"}, format="json").status_code == 202


def test_deleting_what_has_nothing_left_to_wait_for_is_not_a_slow_operation(user, three, api):
    from portal.services import images

    first, second, third = three
    failed = images.image_save(instance=third, name="broken")
    Image.objects.filter(pk=failed.pk).update(status=ImageStatus.FAILED, node=None)
    images.image_save(instance=first, name="a")
    images.image_save(instance=second, name="b")

    assert api.delete(f"/api/v1/images/{failed.pk}/").status_code in (200, 202, 204)
    assert Image.objects.get(pk=failed.pk).status == ImageStatus.DELETED


def test_restarts_under_way_count_against_the_limit(api, three):
    for instance in three:
        Workload.objects.filter(pk=instance.workload_id).update(status=WorkloadStatus.RUNNING)
    first, second, third = three
    assert api.post(f"/api/v1/instances/{first.pk}/restart/").status_code == 202
    assert api.post(f"/api/v1/instances/{second.pk}/restart/").status_code == 202

    refused = api.post(f"/api/v1/instances/{third.pk}/restart/")
    assert refused.status_code == 429 and "restarting" in refused.data["detail"]

    Workload.objects.filter(pk=first.workload_id).update(restarting=False)  # its node restarted it
    assert api.post(f"/api/v1/instances/{third.pk}/restart/").status_code == 202
