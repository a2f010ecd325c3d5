"""Jobs wider than a node: asked for through the API as gpus (and nodes), refused at the field when they cannot
be, shown as one job with its members."""

import pytest

from portal.models import Job
from scheduler.models import Workload
from scheduler.services.allocation import Part, Placement, Share, allocations_create
from tests.conftest import make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_nodes():
    return [make_node("sim:2xRTX3090") for _ in range(2)]


def post(api, catalog, **fields):
    body = {"image": catalog["image"].pk, "gpu_type": catalog["rtx3090"].pk, "command": "true", "memory_gb": 1}
    return api.post("/api/v1/jobs/", body | fields, format="json")


def test_a_job_wider_than_any_node_is_queued_as_one_job_over_several_nodes(api, catalog, two_nodes):
    response = post(api, catalog, gpus="4", cpu_cores=2)
    assert response.status_code == 201, response.data
    assert (response.data["gpus"], response.data["nodes"], response.data["members"]) == ("4.0", None, [])
    job = Job.objects.get()
    assert (job.workload.gpu_count, job.workload.cpu_cores) == (4, 2)  # CPU per node
    exact = post(api, catalog, gpus="4", nodes=2)
    assert exact.status_code == 201 and exact.data["nodes"] == 2


def test_its_members_are_shown_rank_0_first_with_their_hosts(api, catalog, two_nodes):
    job = Job.objects.get(pk=post(api, catalog, gpus="4", nodes=2).data["id"])
    a, b = two_nodes
    parts = [[Share(c.pk, 1000, c.memory_mb) for c in n.gpus.all()] for n in (a, b)]
    assert allocations_create([Placement(job.workload, a.pk, parts[0], rest=(Part(b.pk, parts[1]),))])
    data = api.get(f"/api/v1/jobs/{job.pk}/").data
    assert data["node"] == a.name
    assert [(m["rank"], m["node"], m["status"]) for m in data["members"]] == [
        (0, a.name, "starting"),
        (1, b.name, "starting"),
    ]
    listed = api.get("/api/v1/jobs/").data["results"]
    assert [len(j["members"]) for j in listed] == [2]  # one row for the whole gang


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"gpus": "5", "nodes": 2}, "nodes", "do not split evenly"),
        ({"gpus": "0.5", "nodes": 2}, "nodes", "split evenly"),
        ({"gpus": "6", "nodes": 3}, "nodes", "the cluster has 2 such nodes"),
        ({"gpus": "6"}, "gpus", "the cluster has 4"),
        ({"gpus": "600"}, "gpus", "at most 512 cards per job"),
        ({"gpus": "4", "nodes": 0}, "nodes", ""),
        ({"gpus": "4", "cpu_cores": 64}, "cpu_cores", "per node"),
    ],
    ids=["uneven", "fraction", "too-few-nodes", "too-many-cards", "past-the-limit", "zero-nodes", "cpu"],
)
def test_a_gang_that_cannot_be_is_refused_at_its_field(api, catalog, two_nodes, fields, field, words):
    response = post(api, catalog, **fields)
    assert response.status_code == 400 and field in response.data, response.data
    assert words in str(response.data[field])
    assert not Workload.objects.exists()


def test_an_instance_stays_on_one_node(api, catalog, two_nodes):
    body = {"image": catalog["image"].pk, "gpu_type": catalog["rtx3090"].pk, "gpus": "4", "disk_gb": 5}
    response = api.post("/api/v1/instances/", body, format="json")
    assert response.status_code == 400 and "at most 2 on one node" in str(response.data["gpus"]), response.data


def test_an_outsider_sees_no_members_of_someone_elses_gang(api, outsider_api, catalog, two_nodes):
    job_id = post(api, catalog, gpus="4", nodes=2).data["id"]
    assert outsider_api.get(f"/api/v1/jobs/{job_id}/").status_code == 404


def test_the_console_form_takes_nodes_and_the_page_shows_each_member(client, user, catalog, two_nodes):
    client.force_login(user)
    form = {
        "name": "wide",
        "gpu_type": catalog["rtx3090"].pk,
        "image": catalog["image"].pk,
        "gpus": "4",
        "nodes": "2",
        "cpu_cores": 1,
        "memory_gb": 1,
        "command": "true",
        "priority": 1,
    }
    response = client.post("/jobs/new/", form)
    assert response.status_code == 302, response.content.decode()[-2000:]
    job = Job.objects.get()
    assert (job.workload.gpu_count, job.workload.nodes) == (4, 2)
    a, b = two_nodes
    parts = [[Share(c.pk, 1000, c.memory_mb) for c in n.gpus.all()] for n in (a, b)]
    assert allocations_create([Placement(job.workload, a.pk, parts[0], rest=(Part(b.pk, parts[1]),))])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "Members: 2 nodes" in page and a.name in page and b.name in page
    assert page.count("gpu0, gpu1") == 2  # each member's cards on its node
    assert f"1: {b.name}" in client.get("/jobs/").content.decode()  # one row, its members on it
    uneven = client.post("/jobs/new/", form | {"gpus": "3"})
    assert uneven.status_code == 200 and 'data-field="nodes"' in uneven.content.decode()


def test_an_elastic_job_is_asked_for_through_the_api_and_shows_its_range_and_its_cards_now(api, catalog, two_nodes):
    response = post(api, catalog, gpus="2", elastic_min=1, elastic_max=4)
    assert response.status_code == 201, response.data
    assert (response.data["elastic_min"], response.data["elastic_max"], response.data["cards"]) == (1, 4, 2)
    job = Job.objects.get()
    assert (job.workload.elastic_min, job.workload.elastic_max, job.workload.gpu_count) == (1, 4, 2)
    Workload.objects.filter(pk=job.workload.pk).update(gpu_count=4)  # the tick grew it
    assert api.get(f"/api/v1/jobs/{job.pk}/").data["cards"] == 4
    rigid = post(api, catalog, gpus="2").data
    assert (rigid["elastic_min"], rigid["elastic_max"], rigid["cards"]) == (None, None, 2)


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"gpus": "2", "elastic_min": 1}, "elastic_max", "both elastic_min and elastic_max"),
        ({"gpus": "2", "elastic_min": 3, "elastic_max": 4}, "elastic_min", "1 to gpu_count"),
        ({"gpus": "2", "elastic_min": 1, "elastic_max": 1}, "elastic_max", "at least gpu_count"),
        ({"gpus": "0.5", "elastic_min": 1, "elastic_max": 2}, "elastic_min", "whole cards"),
        ({"gpus": "2", "nodes": 1, "elastic_min": 1, "elastic_max": 4}, "nodes", "leave nodes out"),
        ({"gpus": "2", "elastic_min": 0, "elastic_max": 4}, "elastic_min", ""),
    ],
    ids=["half-a-range", "min-above-asked", "max-below-asked", "a-share", "nodes-given", "zero"],
)
def test_an_elastic_range_that_cannot_be_is_refused_naming_its_field(api, catalog, two_nodes, fields, field, words):
    response = post(api, catalog, **fields)
    assert response.status_code == 400 and field in response.data, response.data
    assert words in str(response.data[field])
    assert not Workload.objects.exists()


def test_the_console_form_asks_for_an_elastic_job_and_refuses_a_bad_range_at_its_field(
    client, user, catalog, two_nodes
):
    client.force_login(user)
    form = {
        "name": "stretchy", "gpu_type": catalog["rtx3090"].pk, "image": catalog["image"].pk, "gpus": "2",
        "cpu_cores": 1, "memory_gb": 1, "command": "true", "priority": 1,
    }  # fmt: skip
    page = client.get("/jobs/new/").content.decode()
    assert 'name="elastic_min"' in page and 'name="elastic_max"' in page
    bad = client.post("/jobs/new/", form | {"elastic_min": "1", "elastic_max": "1"}).content.decode()
    assert 'data-field="elastic_max"' in bad and "at least gpu_count" in bad and not Workload.objects.exists()
    array = client.post("/jobs/new/", form | {"elastic_min": "1", "elastic_max": "4", "array": "0-1"}).content.decode()
    assert 'data-field="elastic_min"' in array and not Workload.objects.exists()
    assert client.post("/jobs/new/", form | {"elastic_min": "1", "elastic_max": "4"}).status_code == 302
    assert (Job.objects.get().workload.elastic_min, Job.objects.get().workload.elastic_max) == (1, 4)
