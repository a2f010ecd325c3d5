"""Console pages: sign-in, the create form with errors at the field, the instance list and its actions."""

import pytest

from portal.models import Instance
from scheduler.models import Workload

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser(client, user):
    client.force_login(user)
    return client


def form(catalog, **overrides):
    data = {
        "name": "nb",
        "gpu_type": catalog["rtx3090"].pk,
        "image": catalog["image"].pk,
        "gpus": "0.3",
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


def test_the_create_page_shows_types_with_price_free_cards_and_simulated(browser, catalog, sim_node):
    page = browser.get("/instances/new/").content.decode()
    assert "RTX 3090 24GB" in page and "1.58" in page
    assert "2 of 2 cards free" in page and "simulated" in page


def test_creating_an_instance_queues_it_and_lists_it(browser, catalog, sim_node):
    response = browser.post("/instances/new/", form(catalog))
    assert response.status_code == 302
    page = browser.get("/").content.decode()
    assert "nb" in page and "Queued" in page and "0.3 × RTX 3090 24GB" in page


@pytest.mark.parametrize(
    ("override", "field"), [({"gpus": "1.5"}, "gpus"), ({"gpus": "3"}, "gpus"), ({"cpu_cores": "0"}, "cpu_cores")]
)
def test_a_bad_form_shows_the_error_at_the_field_and_creates_nothing(browser, catalog, sim_node, override, field):
    page = browser.post("/instances/new/", form(catalog, **override)).content.decode()
    assert f'data-field="{field}"' in page
    assert not Workload.objects.exists()


def test_an_outsider_cannot_act_on_someone_elses_instance_from_the_console(
    browser, client, catalog, sim_node, outsider
):
    browser.post("/instances/new/", form(catalog))
    instance = Instance.objects.get()
    client.force_login(outsider)
    response = client.post(f"/instances/{instance.pk}/stop/", follow=True)
    assert "no such instance" in response.content.decode()
    assert "nb" not in client.get("/").content.decode()
    instance.workload.refresh_from_db()
    assert instance.workload.status == "queued"


def test_stopping_a_queued_instance_from_the_console(browser, catalog, sim_node):
    browser.post("/instances/new/", form(catalog))
    instance = Instance.objects.get()
    browser.post(f"/instances/{instance.pk}/stop/")
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
        "priority": 0,
    }
    return {**data, **overrides}


def test_submitting_a_job_from_the_console_shows_it_queued_with_its_reason(browser, catalog, sim_node):
    response = browser.post("/jobs/new/", job_form(catalog))
    assert response.status_code == 302
    page = browser.get(response.url).content.decode()
    assert "resnet" in page and "Queued" in page and "python train.py" in page
    assert "resnet" in browser.get("/jobs/").content.decode()


def test_a_bad_job_form_shows_the_error_at_the_field(browser, catalog, sim_node):
    page = browser.post("/jobs/new/", job_form(catalog, gpus="4")).content.decode()
    assert 'data-field="gpus"' in page and "at most 2 on one node" in page
    assert not Workload.objects.exists()


def test_an_outsider_cannot_see_someone_elses_job(browser, client, catalog, sim_node, outsider):
    browser.post("/jobs/new/", job_form(catalog))
    job_id = Workload.objects.get().job.pk
    client.force_login(outsider)
    response = client.get(f"/jobs/{job_id}/", follow=True)
    assert "no such job" in response.content.decode() and "python train.py" not in response.content.decode()
