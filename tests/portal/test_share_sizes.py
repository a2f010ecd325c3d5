"""Fractions of a card come in the sizes on offer: a card serves one share size at a time (its MPS daemon's
limits are per card), so a size not on offer is refused naming the field, and the API and console say which."""

import pytest
from django.test import Client

from portal.models import Instance, Job
from scheduler.models import Workload
from scheduler.policy import SHARE_FRACTIONS
from tests.portal.test_instance_api import create

pytestmark = pytest.mark.django_db

OFFERED = [str(f) for f in SHARE_FRACTIONS]
NOT_OFFERED = "0.3"  # between sizes on offer (0.1 .. 0.9 were all allowed before)


def job(api, catalog, gpus):
    body = {"name": "t", "image": catalog["image"].pk, "gpu_type": catalog["rtx3090"].pk, "gpus": gpus}
    return api.post("/api/v1/jobs/", body | {"command": "true", "cpu_cores": 1, "memory_gb": 1}, format="json")


def test_an_instance_of_a_size_not_on_offer_is_refused_naming_the_field_and_the_sizes(api, catalog, sim_node):
    response = create(api, catalog, gpus=NOT_OFFERED)
    assert response.status_code == 400
    message = str(response.data["gpus"])
    assert "not offered" in message and all(size in message for size in OFFERED)
    assert not Workload.objects.exists() and not Instance.objects.exists()


def test_a_job_of_a_size_not_on_offer_is_refused_naming_the_field(api, catalog, sim_node):
    response = job(api, catalog, "0.25" if "0.25" not in OFFERED else NOT_OFFERED)
    assert response.status_code == 400 and "gpus" in response.data
    assert not Job.objects.exists()


def test_every_size_on_offer_is_accepted(api, catalog, sim_node):
    for size in OFFERED:
        response = create(api, catalog, name=f"s{size}", gpus=size)
        assert response.status_code == 201, response.data
        assert Workload.objects.get(pk=Instance.objects.get(pk=response.data["id"]).workload_id).gpu_milli == int(
            float(size) * 1000
        )


def test_a_price_quote_for_a_size_not_on_offer_is_refused_naming_the_field(api, catalog):
    response = api.get(f"/api/v1/prices/?gpu_type={catalog['rtx3090'].pk}&gpus={NOT_OFFERED}")
    assert response.status_code == 400 and "gpus" in response.data


def test_the_gpu_types_say_which_sizes_are_on_offer(api, catalog):
    [first, *_] = api.get("/api/v1/gpu-types/").data["results"]
    assert first["share_sizes"] == OFFERED


def test_the_console_offers_exactly_the_sizes_on_offer_and_whole_cards(user, catalog, sim_node):
    console = Client()
    console.force_login(user)
    for path in ("/instances/new/", "/jobs/new/"):
        page = console.get(path).content.decode()
        assert 'list="gpu-sizes"' in page
        offered = page[page.index('<datalist id="gpu-sizes">') : page.index("</datalist>")]
        values = [chunk.split('"')[0] for chunk in offered.split('value="')[1:]]
        assert values == [*OFFERED, "1", "2", "4", "8"]
        assert f"a share of one card: {', '.join(OFFERED)}" in page


def test_the_console_shows_the_refusal_at_the_field(user, catalog, sim_node):
    console = Client()
    console.force_login(user)
    form = {"name": "j", "gpu_type": catalog["rtx3090"].pk, "image": catalog["image"].pk, "gpus": NOT_OFFERED}
    page = console.post("/jobs/new/", form | {"command": "true", "cpu_cores": 1, "memory_gb": 1, "priority": 1})
    page = page.content.decode()
    assert 'data-field="gpus"' in page and "not offered" in page
    assert not Job.objects.exists()
