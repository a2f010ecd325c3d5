"""The demo catalog offers only images that hold what they name: new ones wait for their build ("building",
listed, refused at the image field), the earlier BusyBox stand-ins under framework names are no longer offered
but work made from them keeps its image."""

import io

import pytest
import requests
from django.core.management import CommandError, call_command

from portal.models import Image, ImageStatus, Instance
from portal.services.demo import IMAGES, RETIRED_IMAGES, catalog_load
from tests.portal.test_instance_api import create

pytestmark = pytest.mark.django_db


def test_new_catalog_images_are_listed_as_building_and_refused_at_the_image_field_until_built(api, catalog, sim_node):
    pytorch = Image.objects.get(name="PyTorch 2.13.0 (CPU)")
    assert pytorch.docker_ref == "gpucloud/pytorch:2.13.0-cpu" and pytorch.cuda_version == ""
    assert {i.status for i in Image.objects.filter(name__in=[row[0] for row in IMAGES])} == {ImageStatus.BUILDING}

    listed = {i["name"]: i for i in api.get("/api/v1/images/").json()["results"]}
    assert listed[pytorch.name]["status"] == "building"
    assert listed[pytorch.name]["status_reason"] == "waiting for manage.py build_images"

    response = create(api, catalog, image=pytorch.pk)
    assert response.status_code == 400 and "still being built" in str(response.data["image"]), response.data

    Image.objects.filter(pk=pytorch.pk).update(status=ImageStatus.FAILED, status_reason="mmdebstrap failed")
    response = create(api, catalog, image=pytorch.pk)
    assert response.status_code == 400 and "mmdebstrap failed" in str(response.data["image"]), response.data

    Image.objects.filter(pk=pytorch.pk).update(status=ImageStatus.READY, status_reason="")
    catalog_load()  # loading again keeps what the build found
    assert Image.objects.get(pk=pytorch.pk).status == ImageStatus.READY
    made = create(api, catalog, image=pytorch.pk)
    assert made.status_code == 201, made.data


def test_the_earlier_stand_ins_are_no_longer_offered_and_work_made_from_them_keeps_its_image(api, catalog, sim_node):
    old = Image.objects.create(
        name="PyTorch 2.5.1 / CUDA 12.4",
        framework="PyTorch",
        framework_version="2.5.1",
        cuda_version="12.4",
        docker_ref="gpucloud/pytorch:2.5.1-cuda12.4",
    )  # as an earlier version's load_demo left it
    made = create(api, catalog, image=old.pk)
    assert made.status_code == 201, made.data

    catalog_load()
    old.refresh_from_db()
    assert old.status == ImageStatus.RETIRED and "BusyBox stand-in" in old.status_reason
    assert Instance.objects.get(pk=made.data["id"]).image == old
    assert old.name in RETIRED_IMAGES
    assert old.name not in {i["name"] for i in api.get("/api/v1/images/").json()["results"]}
    refused = create(api, catalog, image=old.pk)
    assert refused.status_code == 400 and "no longer offered" in str(refused.data["image"]), refused.data
    assert api.get(f"/api/v1/instances/{made.data['id']}/").json()["id"] == made.data["id"]


def test_build_images_marks_an_image_it_cannot_provide_failed_saying_why(catalog):
    ref = "gpucloud/nowhere:1"
    row = Image.objects.create(
        name="Nowhere", framework="X", framework_version="1", cuda_version="", docker_ref=ref, status="building"
    )
    with pytest.raises(CommandError, match=f"not available: {ref}"):
        call_command("build_images", "--only", ref, stdout=io.StringIO(), stderr=io.StringIO())
    row.refresh_from_db()
    assert row.status == ImageStatus.FAILED
    assert row.status_reason.startswith(f"no recipe for {ref} and this engine does not have it"), row.status_reason


def _cut(times: int):
    """The engine's answer to "is the image here?" cut short ``times`` times (its connection closed mid-response,
    as requests reports it), then "yes"."""
    calls = []

    def image_exists(ref):
        calls.append(ref)
        if len(calls) <= times:
            raise requests.exceptions.ChunkedEncodingError("Response ended prematurely")
        return True

    return image_exists, calls


@pytest.mark.parametrize("cuts", [1, 2])
def test_build_images_tries_once_more_when_the_engine_cuts_its_answer_short_and_else_says_failed(
    catalog, monkeypatch, cuts
):
    ref = "gpucloud/operators-own:1"
    row = Image.objects.create(
        name="Own", framework="X", framework_version="1", cuda_version="", docker_ref=ref, status="building"
    )
    image_exists, calls = _cut(cuts)
    monkeypatch.setattr("agent.management.commands.build_images.image_exists", image_exists)
    stderr = io.StringIO()
    if cuts == 1:
        call_command("build_images", "--only", ref, stdout=io.StringIO(), stderr=stderr)
    else:
        with pytest.raises(CommandError, match=f"not available: {ref}"):
            call_command("build_images", "--only", ref, stdout=io.StringIO(), stderr=stderr)
    row.refresh_from_db()
    assert len(calls) == 2 and "answer was cut short (Response ended prematurely); once more" in stderr.getvalue()
    if cuts == 1:
        assert row.status == ImageStatus.READY
    else:  # never left "building" by a traceback: failed, saying why
        assert (row.status, row.status_reason) == (ImageStatus.FAILED, "Response ended prematurely")
