"""A job's code (a .tar.gz of the user's folder): checked, then stored with its workload for its node's agent.

The agent extracts it into the job's data disk (JOB_CODE_PATH, the command's working
directory) each time it creates the job's container (``agent/launcher.py``):
on a resume too, so the code is the one submitted (what the job wrote elsewhere on the
disk stays). Docker extracts it inside the container's own filesystem, but an archive
whose members leave the folder (``..``, absolute paths) is refused anyway: it is a mistake.

Docker expands it in its own daemon, outside the tenant's cgroup: a gzip bomb (a few MB that
expand to many GB) would cost the host, not the tenant. So the archive is read through once, as
a stream, counting what it expands to, and refused past CODE_EXPANDED_MAX_MB — before the rest is
expanded; a sparse member (which Docker writes out whole, holes as zeros) is refused. The check
runs when the job is submitted and again before its node's Docker gets it (``agent.launcher``).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import posixpath
import tarfile

from django.conf import settings

from core.errors import InvalidInput
from scheduler.models import Workload, WorkloadCode

FIELD = "code"
CODE_EXPANDED_MAX_MB = 1024  # what an archive may expand to (tar headers and members' bytes)


def code_check(archive: bytes) -> None:
    """InvalidInput naming ``code`` unless ``archive`` is a gzip'd tar of at most JOB_CODE_MAX_MB, expanding to at
    most CODE_EXPANDED_MAX_MB, whose members are files, folders or links that all stay inside its folder."""
    if len(archive) > settings.JOB_CODE_MAX_MB * 1024 * 1024:
        raise InvalidInput(f"the code archive may be at most {settings.JOB_CODE_MAX_MB} MB", field=FIELD)
    try:
        with tarfile.open(fileobj=_Expanded(archive, CODE_EXPANDED_MAX_MB), mode="r|") as tar:
            for member in tar:
                name = posixpath.normpath(member.name)
                if name.startswith(("/", "../")) or name == "..":
                    raise InvalidInput(f"{member.name!r} leaves the code folder", field=FIELD)
                if member.issparse():
                    raise InvalidInput(f"{member.name!r} is a sparse file: pack it without --sparse", field=FIELD)
                if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
                    raise InvalidInput(f"{member.name!r} is not a file, folder or link", field=FIELD)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise InvalidInput(f"not a .tar.gz archive: {exc}", field=FIELD) from exc


class _Expanded(io.RawIOBase):
    """The gunzipped bytes of ``archive``, as a stream; InvalidInput as soon as more than ``max_mb`` MB came."""

    def __init__(self, archive: bytes, max_mb: int):
        self._gunzip = gzip.GzipFile(fileobj=io.BytesIO(archive))
        self._left, self._max_mb = max_mb * 1024 * 1024, max_mb

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._gunzip.read(min(size, self._left + 1) if size >= 0 else self._left + 1)
        self._left -= len(data)
        if self._left < 0:
            raise InvalidInput(f"the code archive expands to more than {self._max_mb} MB", field=FIELD)
        return data


def workload_code_attach(*, workload: Workload, archive: bytes) -> WorkloadCode:
    """Store ``archive`` (checked with ``code_check``) as the job's code; call in the transaction that submits it,
    so its launch, sent after commit, finds it."""
    code_check(archive)
    return WorkloadCode.objects.create(
        workload=workload, archive=archive, size_bytes=len(archive), sha256=hashlib.sha256(archive).hexdigest()
    )


def array_code_attach(*, workloads: list[Workload], archive: bytes) -> WorkloadCode:
    """Store an array's code once for all its tasks (``workloads``, one group): with the first, where every
    task's launch finds it (``workload_code_archive``). Call in the transaction that submits them."""
    return workload_code_attach(workload=min(workloads, key=lambda w: w.pk), archive=archive)


def workload_code_archive(workload_id: int) -> bytes | None:
    """The job's code archive, or None when it was submitted without one. A task of an array has its
    array's: sent once, stored once with the array's first task (``array_code_attach``)."""
    archive = WorkloadCode.objects.filter(workload_id=workload_id).values_list("archive", flat=True).first()
    if archive is None:
        group = Workload.objects.filter(pk=workload_id).values_list("group_id", flat=True).first()
        if group is not None:
            codes = WorkloadCode.objects.filter(workload__group_id=group).order_by("workload_id")
            archive = codes.values_list("archive", flat=True).first()
    return None if archive is None else bytes(archive)
