"""Idempotency-Key: a retried create request creates one thing and gets the first answer again."""

import threading

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from rest_framework.test import APIClient

from portal.models import Instance, Job
from tests.portal.test_instance_api import create
from tests.portal.test_job_code_and_files_api import archive

KEY = {"HTTP_IDEMPOTENCY_KEY": "2f1c0a7e-retry-me"}


@pytest.mark.django_db
def test_a_retried_create_with_the_same_key_creates_one_instance_and_answers_the_same(api, catalog, sim_node):
    first = api.post("/api/v1/instances/", body(catalog), format="json", **KEY)
    again = api.post("/api/v1/instances/", body(catalog), format="json", **KEY)
    assert first.status_code == again.status_code == 201
    assert again.data["id"] == first.data["id"]
    assert Instance.objects.count() == 1


@pytest.mark.django_db
def test_the_same_key_with_another_request_is_a_conflict(api, catalog, sim_node):
    assert api.post("/api/v1/instances/", body(catalog), format="json", **KEY).status_code == 201
    other = api.post("/api/v1/instances/", body(catalog, name="other"), format="json", **KEY)
    assert other.status_code == 409 and "different request" in other.data["detail"]
    assert Instance.objects.count() == 1


@pytest.mark.django_db
def test_keys_are_per_user_and_requests_without_a_key_are_not_deduplicated(api, outsider_api, catalog, sim_node):
    assert api.post("/api/v1/instances/", body(catalog), format="json", **KEY).status_code == 201
    assert outsider_api.post("/api/v1/instances/", body(catalog), format="json", **KEY).status_code == 201
    assert create(api, catalog).status_code == create(api, catalog).status_code == 201
    assert Instance.objects.count() == 4


@pytest.mark.django_db
def test_a_refused_request_does_not_use_up_its_key(api, catalog, sim_node):
    refused = api.post("/api/v1/instances/", body(catalog, gpus="3"), format="json", **KEY)
    assert refused.status_code == 400
    assert api.post("/api/v1/instances/", body(catalog, gpus="3"), format="json", **KEY).status_code == 400
    assert not Instance.objects.exists()


@pytest.mark.django_db
def test_jobs_take_an_idempotency_key_too(api, catalog, sim_node):
    job = {"image": catalog["image"].pk, "gpu_type": catalog["rtx3090"].pk, "gpus": "1", "command": "true"}
    ids = {api.post("/api/v1/jobs/", job, format="json", **KEY).data["id"] for _ in range(3)}
    assert len(ids) == 1 and Job.objects.count() == 1


@pytest.mark.django_db
def test_the_same_key_with_other_code_under_the_same_file_name_is_a_conflict(api, catalog, sim_node):
    code = archive({"run.sh": b"echo first\n"})
    assert submit_code(api, catalog, code).status_code == 201
    other = submit_code(api, catalog, archive({"run.sh": b"echo other\n"}))
    assert other.status_code == 409 and "Idempotency-Key" in other.data["detail"]
    assert Job.objects.count() == 1 and bytes(Job.objects.get().workload.code.archive) == code


@pytest.mark.django_db
def test_the_same_key_with_the_same_code_answers_the_first_job(api, catalog, sim_node):
    code = archive({"run.sh": b"echo hi\n"})
    first, again = submit_code(api, catalog, code), submit_code(api, catalog, code)
    assert first.status_code == again.status_code == 201 and again.data["id"] == first.data["id"]
    assert Job.objects.count() == 1


def submit_code(api, catalog, code: bytes):
    form = {
        "image": catalog["image"].pk, "gpu_type": catalog["rtx3090"].pk, "gpus": "0.5", "cpu_cores": 1,
        "memory_gb": 1, "command": "sh run.sh", "code": SimpleUploadedFile("code.tar.gz", code),
    }  # fmt: skip
    return api.post("/api/v1/jobs/", form, format="multipart", **KEY)


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_with_one_key_create_one_instance(user, catalog, sim_node):
    if connection.vendor != "postgresql":
        pytest.fail("run on PostgreSQL (make test does)")
    answers, barrier = [], threading.Barrier(4)

    def post():
        client = APIClient()
        client.force_authenticate(user)
        barrier.wait(10)
        try:
            answers.append(client.post("/api/v1/instances/", body(catalog), format="json", **KEY))
        finally:
            connection.close()

    threads = [threading.Thread(target=post) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [a.status_code for a in answers] == [201] * 4
    assert len({a.data["id"] for a in answers}) == 1
    assert Instance.objects.count() == 1


def body(catalog, **overrides):
    return {
        "name": "train",
        "image": catalog["image"].pk,
        "gpu_type": catalog["rtx3090"].pk,
        "gpus": "0.5",
        "cpu_cores": 1,
        "memory_gb": 1,
        "disk_gb": 20,
    } | overrides


@pytest.mark.django_db
@pytest.mark.parametrize("length", [255, 256, 10_000])
def test_a_key_of_any_length_is_answered_never_a_server_error(api, catalog, sim_node, length):
    key = {"HTTP_IDEMPOTENCY_KEY": "é" * length}  # latin-1, as an HTTP header can carry it
    answers = [api.post("/api/v1/instances/", body(catalog), format="json", **key) for _ in range(2)]
    if length <= 255:
        assert [a.status_code for a in answers] == [201, 201] and answers[0].data["id"] == answers[1].data["id"]
    else:
        assert [a.status_code for a in answers] == [400, 400] and "Idempotency-Key" in answers[0].data
