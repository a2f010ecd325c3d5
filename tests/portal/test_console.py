"""Console pages: sign-in, the create form with errors at the field, the instance list and its actions."""

import pytest
from django.test import Client

from portal.models import Instance
from scheduler.models import Workload

pytestmark = pytest.mark.django_db


@pytest.fixture
def console(user):
    """The owner's own signed-in client (apart from the ``client`` fixture, which outsiders use)."""
    client = Client()
    client.force_login(user)
    return client


def form(catalog, **overrides):
    data = {
        "name": "nb",
        "gpu_type": catalog["rtx3090"].pk,
        "image": catalog["image"].pk,
        "gpus": "0.5",
        "cpu_cores": 2,
        "memory_gb": 4,
        "disk_gb": 30,
        "billing_mode": "on_demand",
    }
    return {**data, **overrides}


def test_pages_need_a_signed_in_user(client):
    response = client.get("/")
    assert response.status_code == 302 and response.url.startswith("/login/")
    assert client.get("/login/").status_code == 200


def test_the_create_page_shows_types_with_price_free_cards_and_simulated(console, catalog, sim_node):
    page = console.get("/instances/new/").content.decode()
    assert "RTX 3090 24GB" in page and "1.58" in page
    assert "2 of 2 cards free" in page and "simulated" in page


def test_creating_an_instance_queues_it_and_lists_it(console, catalog, sim_node):
    response = console.post("/instances/new/", form(catalog))
    assert response.status_code == 302
    page = console.get("/").content.decode()
    assert "nb" in page and "Queued" in page and "0.5 × RTX 3090 24GB" in page


@pytest.mark.parametrize(
    ("override", "field"), [({"gpus": "1.5"}, "gpus"), ({"gpus": "3"}, "gpus"), ({"cpu_cores": "0"}, "cpu_cores")]
)
def test_a_bad_form_shows_the_error_at_the_field_and_creates_nothing(console, catalog, sim_node, override, field):
    page = console.post("/instances/new/", form(catalog, **override)).content.decode()
    assert f'data-field="{field}"' in page
    assert not Workload.objects.exists()


def test_an_outsider_cannot_act_on_someone_elses_instance_from_the_console(
    console, client, catalog, sim_node, outsider
):
    console.post("/instances/new/", form(catalog))
    instance = Instance.objects.get()
    client.force_login(outsider)
    response = client.post(f"/instances/{instance.pk}/stop/")
    assert response.status_code == 404  # as the API answers: no hint that it exists
    assert f'data-instance="{instance.pk}"' not in client.get("/").content.decode()
    instance.workload.refresh_from_db()
    assert instance.workload.status == "queued"


def test_stopping_a_queued_instance_from_the_console(console, catalog, sim_node):
    console.post("/instances/new/", form(catalog))
    instance = Instance.objects.get()
    console.post(f"/instances/{instance.pk}/stop/")
    instance.workload.refresh_from_db()
    assert instance.workload.status == "stopped"


def job_form(catalog, **overrides):
    data = {
        "name": "resnet",
        "gpu_type": catalog["rtx3090"].pk,
        "image": catalog["image"].pk,
        "gpus": "1",
        "command": "python train.py",
        "cpu_cores": 2,
        "memory_gb": 4,
        "priority": 1,
    }
    return {**data, **overrides}


def test_submitting_a_job_from_the_console_shows_it_queued_with_its_reason(console, catalog, sim_node):
    response = console.post("/jobs/new/", job_form(catalog))
    assert response.status_code == 302
    page = console.get(response.url).content.decode()
    assert "resnet" in page and "Queued" in page and "python train.py" in page
    assert "resnet" in console.get("/jobs/").content.decode()


def test_a_bad_job_form_shows_the_error_at_the_field(console, catalog, sim_node):
    # A job may span nodes, but the whole cluster has two of these cards.
    page = console.post("/jobs/new/", job_form(catalog, gpus="4")).content.decode()
    assert 'data-field="gpus"' in page and "the cluster has 2" in page
    assert not Workload.objects.exists()


def test_an_outsider_cannot_see_someone_elses_job(console, client, catalog, sim_node, outsider):
    console.post("/jobs/new/", job_form(catalog))
    job_id = Workload.objects.get().job.pk
    client.force_login(outsider)
    response = client.get(f"/jobs/{job_id}/")
    assert response.status_code == 404 and "python train.py" not in response.content.decode()
    assert client.post(f"/jobs/{job_id}/cancel/").status_code == 404
    assert Workload.objects.get().status == "queued"
