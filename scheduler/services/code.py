"""A job's code (a .tar.gz of the user's folder): checked, then stored with its workload for its node's agent.

The agent extracts it into the job's data disk (JOB_CODE_PATH, the command's working
directory) each time it creates the job's container (``scheduler/node/launcher.py``):
on a resume too, so the code is the one submitted (what the job wrote elsewhere on the
disk stays). Docker extracts it inside the container's own filesystem, but an archive
whose members leave the folder (``..``, absolute paths) is refused anyway: it is a mistake.
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import tarfile

from django.conf import settings

from scheduler.errors import InvalidInput
from scheduler.models import Workload, WorkloadCode

FIELD = "code"


def code_check(archive: bytes) -> None:
    """InvalidInput naming ``code`` unless ``archive`` is a gzip'd tar of at most JOB_CODE_MAX_MB whose
    members all stay inside the folder it is extracted into."""
    if len(archive) > settings.JOB_CODE_MAX_MB * 1024 * 1024:
        raise InvalidInput(f"the code archive may be at most {settings.JOB_CODE_MAX_MB} MB", field=FIELD)
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            for member in tar:
                name = posixpath.normpath(member.name)
                if name.startswith(("/", "../")) or name == "..":
                    raise InvalidInput(f"{member.name!r} leaves the code folder", field=FIELD)
                if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
                    raise InvalidInput(f"{member.name!r} is not a file, folder or link", field=FIELD)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise InvalidInput(f"not a .tar.gz archive: {exc}", field=FIELD) from exc


def workload_code_attach(*, workload: Workload, archive: bytes) -> WorkloadCode:
    """Store ``archive`` (checked with ``code_check``) as the job's code; call in the transaction that submits it,
    so its launch, sent after commit, finds it."""
    code_check(archive)
    return WorkloadCode.objects.create(
        workload=workload, archive=archive, size_bytes=len(archive), sha256=hashlib.sha256(archive).hexdigest()
    )


def workload_code_archive(workload_id: int) -> bytes | None:
    """The job's code archive, or None when it was submitted without one."""
    archive = WorkloadCode.objects.filter(workload_id=workload_id).values_list("archive", flat=True).first()
    return None if archive is None else bytes(archive)
