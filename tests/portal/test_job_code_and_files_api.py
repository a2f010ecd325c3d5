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
    ids=["not-gzip", "dot-dot", "absolute"],  # the archives' bytes hold a time: ids of their own (xdist compares)
)
def test_a_code_archive_that_is_not_a_tidy_tar_gz_is_refused_naming_code(api, catalog, sim_node, code, says):
    response = submit(api, catalog, code)
    assert response.status_code == 400 and says in response.data["code"][0]
    assert not Job.objects.exists()


def test_code_past_the_size_cap_is_refused(api, catalog, sim_node, settings):
    settings.JOB_CODE_MAX_MB = 0
    response = submit(api, catalog, archive({"run.sh": b"echo hi\n"}))
    assert response.status_code == 400 and "at most 0 MB" in response.data["code"][0]


def test_code_that_expands_past_its_cap_is_refused_naming_code(api, catalog, sim_node, monkeypatch):
    from scheduler.services import code

    monkeypatch.setattr(code, "CODE_EXPANDED_MAX_MB", 1, raising=False)  # not there before the bound
    bomb = archive({"zeros.bin": bytes(64 * 1024 * 1024)})  # 64 MB of zeros in about 64 kB
    assert len(bomb) < 1024 * 1024
    response = submit(api, catalog, bomb)
    assert response.status_code == 400 and "expands to more than 1 MB" in response.data["code"][0], response.data
    assert not Job.objects.exists()


def test_a_sparse_member_that_would_expand_to_a_terabyte_is_refused_naming_code(api, catalog, sim_node):
    """GNU sparse 1.0 (PAX): a map of no data, a "real size" of 1 TB, which Docker would write out as zeros."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        entry = tarfile.TarInfo("GNUSparseFile.0/huge.bin")
        sparse_map = b"1\n0\n0\n".ljust(tarfile.BLOCKSIZE, b"\0")
        entry.size = len(sparse_map)
        entry.pax_headers = {
            "GNU.sparse.major": "1",
            "GNU.sparse.minor": "0",
            "GNU.sparse.name": "huge.bin",
            "GNU.sparse.realsize": str(1024**4),
        }
        tar.addfile(entry, io.BytesIO(sparse_map))
    response = submit(api, catalog, buffer.getvalue())
    assert response.status_code == 400 and "huge.bin" in response.data["code"][0], response.data
    assert not Job.objects.exists()


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


def test_an_upload_into_an_ended_job_is_refused_saying_where_results_belong(api, catalog, sim_node):
    from scheduler.models import Workload, WorkloadStatus

    job_id = submit(api, catalog, archive({"run.sh": b"echo hi\n"})).data["id"]
    Workload.objects.filter(job__pk=job_id).update(status=WorkloadStatus.SUCCEEDED)
    path = f"/api/v1/jobs/{job_id}/files/upload/?path=/root/checkpoints&name=x"
    refused = api.put(path, b"x", content_type="application/octet-stream")
    assert refused.status_code == 409, refused
    assert "has ended (succeeded)" in refused.data["detail"] and "/root/autodl-fs" in refused.data["detail"]


def submit_array(api, catalog, code: bytes, **fields):
    form = {
        "image": catalog["image"].pk, "gpu_type": catalog["rtx3090"].pk, "gpus": "0.5", "cpu_cores": 1,
        "memory_gb": 1, "command": "sh run.sh", "code": SimpleUploadedFile("code.tar.gz", code), **fields,
    }  # fmt: skip
    return api.post("/api/v1/arrays/", form, format="multipart")


def test_an_array_submitted_as_a_form_stores_its_code_once_for_every_task(api, catalog, sim_node):
    from scheduler.models import WorkloadCode
    from scheduler.services.code import workload_code_archive

    code = archive({"run.sh": b'echo "task $GPUCLOUD_ARRAY_INDEX lr=$LR"\n'})
    response = submit_array(api, catalog, code, params='{"lr": ["1e-3", "3e-4"], "bs": ["32", "64"]}')
    assert response.status_code == 201, response.data
    tasks = Job.objects.filter(array_id=response.data["id"])
    assert tasks.count() == 4 and WorkloadCode.objects.count() == 1  # sent once, stored once
    assert [workload_code_archive(task.workload_id) for task in tasks] == [code] * 4  # each task's launch finds it
    assert {(task.params["lr"], task.params["bs"]) for task in tasks} == {
        ("1e-3", "32"), ("1e-3", "64"), ("3e-4", "32"), ("3e-4", "64"),
    }  # fmt: skip


def test_a_job_outside_the_array_does_not_get_its_code(api, catalog, sim_node):
    from scheduler.services.code import workload_code_archive

    assert submit_array(api, catalog, archive({"run.sh": b"echo hi\n"}), array="0-1").status_code == 201
    single = api.post("/api/v1/jobs/", {"image": catalog["image"].pk, "gpu_type": catalog["rtx3090"].pk, "gpus": "0.5",
                                         "cpu_cores": 1, "memory_gb": 1, "command": "true"}, format="json")  # fmt: skip
    assert single.status_code == 201, single.data
    assert workload_code_archive(Job.objects.get(pk=single.data["id"]).workload_id) is None


@pytest.mark.parametrize("code, says", [(b"not a tarball", "not a .tar.gz archive"), (None, "at most 0 MB")])
def test_an_arrays_bad_code_is_refused_naming_code_and_queues_no_task(api, catalog, sim_node, settings, code, says):
    from portal.models import JobArray

    if code is None:
        settings.JOB_CODE_MAX_MB, code = 0, archive({"run.sh": b"echo hi\n"})
    response = submit_array(api, catalog, code, array="0-3")
    assert response.status_code == 400 and says in response.data["code"][0], response.data
    assert not JobArray.objects.exists() and not Job.objects.exists()
