"""A job's code sent with it (multipart ``code``), and the files API's refusals; the happy paths run through the
real CLI in tests/client/test_cli.py."""

import io
import tarfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from portal.models import Job

pytestmark = pytest.mark.django_db


def archive(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(data)
            tar.addfile(entry, io.BytesIO(data))
    return buffer.getvalue()


def submit(api, catalog, code: bytes):
    form = {
        "image": catalog["image"].pk, "gpu_type": catalog["rtx3090"].pk, "gpus": "0.5", "cpu_cores": 1,
        "memory_gb": 1, "command": "sh run.sh", "code": SimpleUploadedFile("code.tar.gz", code),
    }  # fmt: skip
    return api.post("/api/v1/jobs/", form, format="multipart")


def test_a_job_submitted_as_a_form_keeps_its_code_for_its_node(api, catalog, sim_node):
    code = archive({"run.sh": b"echo hi\n"})
    response = submit(api, catalog, code)
    assert response.status_code == 201, response.data
    stored = Job.objects.get(pk=response.data["id"]).workload.code
    assert bytes(stored.archive) == code and stored.size_bytes == len(code)


@pytest.mark.parametrize(
    "code, says",
    [
        (b"not a tarball", "not a .tar.gz archive"),
        (archive({"../escape.sh": b"x"}), "leaves the code folder"),
        (archive({"/etc/passwd": b"x"}), "leaves the code folder"),
    ],
)
def test_a_code_archive_that_is_not_a_tidy_tar_gz_is_refused_naming_code(api, catalog, sim_node, code, says):
    response = submit(api, catalog, code)
    assert response.status_code == 400 and says in response.data["code"][0]
    assert not Job.objects.exists()


def test_code_past_the_size_cap_is_refused(api, catalog, sim_node, settings):
    settings.JOB_CODE_MAX_MB = 0
    response = submit(api, catalog, archive({"run.sh": b"echo hi\n"}))
    assert response.status_code == 400 and "at most 0 MB" in response.data["code"][0]


def test_the_files_of_a_job_are_its_owners_and_only_while_it_runs(api, outsider_api, catalog, sim_node):
    job_id = submit(api, catalog, archive({"run.sh": b"echo hi\n"})).data["id"]
    listing = f"/api/v1/jobs/{job_id}/files/?path=/root/checkpoints"
    assert outsider_api.get(listing).status_code == 404
    queued = api.get(listing)
    assert queued.status_code == 409 and "this one is queued" in queued.data["detail"], queued.data
    outside = api.get(f"/api/v1/jobs/{job_id}/files/?path=/etc")
    assert outside.status_code == 400 and "path" in outside.data
    upload = api.put(f"/api/v1/jobs/{job_id}/files/upload/?path=/root/checkpoints", b"x", content_type="text/plain")
    assert upload.status_code == 400 and "name" in upload.data


def test_the_files_of_an_ended_job_are_refused_saying_where_results_belong(api, catalog, sim_node):
    from scheduler.models import Workload, WorkloadStatus

    job_id = submit(api, catalog, archive({"run.sh": b"echo hi\n"})).data["id"]
    Workload.objects.filter(job__pk=job_id).update(status=WorkloadStatus.SUCCEEDED)
    refused = api.get(f"/api/v1/jobs/{job_id}/files/download/?path=/root/checkpoints/model.pt")
    assert refused.status_code == 409, refused
    assert "has ended (succeeded)" in refused.data["detail"] and "/root/autodl-fs" in refused.data["detail"]
