"""Files pages: browse, download and upload in the owner's running instance (see portal/services/files.py)."""

import posixpath

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.files.uploadhandler import StopUpload, TemporaryFileUploadHandler
from django.http import StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import content_disposition_header, urlencode
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_POST, require_safe

from core.errors import ServiceError
from portal import selectors
from portal.console.shortcuts import or_404
from portal.models import Instance
from portal.services import files


def _owned(request, instance_id: int) -> Instance:
    return or_404(selectors.instance_get_owned, user=request.user, instance_id=instance_id)


@login_required
@require_safe
def instance_files(request, instance_id: int):
    instance = _owned(request, instance_id)
    return _files_page(request, instance, request.GET.get("path", files.ROOTS[0]))


def _files_page(request, instance: Instance, path: str, *, error: ServiceError | None = None):
    """The folder's page; with ``error`` (of an operation on a file in it) shown, and its status answered."""
    entries, truncated = [], False
    try:
        entries, truncated = files.listing(instance.workload, path, user=request.user)
        path = files.safe_path(path)
    except ServiceError as exc:
        error = error or exc
    parent = path.rsplit("/", 1)[0] if path != files.HOME else None
    return render(
        request,
        "portal/instance_files.html",
        {
            "instance": instance,
            "path": path,
            "parent": parent,
            "entries": entries,
            "truncated": truncated,
            "error": error and (f"{error.field}: {error.message}" if error.field else error.message),
            "roots": files.ROOTS,
        },
        status=error.status_code if error else 200,
    )


@login_required
@require_safe
def instance_file_download(request, instance_id: int):
    instance = _owned(request, instance_id)
    path = request.GET.get("path", "")
    try:
        name, size, chunks = files.download(instance.workload, path, user=request.user)
    except ServiceError as exc:  # the folder's page, saying why, with the error's status (400 naming path)
        try:
            folder = posixpath.dirname(files.safe_path(path))
        except ServiceError:
            folder = files.ROOTS[0]
        return _files_page(request, instance, folder, error=exc)
    response = StreamingHttpResponse(chunks, content_type="application/octet-stream")
    response["Content-Length"] = str(size)
    response["Content-Disposition"] = content_disposition_header(True, name)
    return response


class LimitedUpload(TemporaryFileUploadHandler):
    """Stops reading an upload as soon as it passes FILE_TRANSFER_MAX_MB (nothing bigger lands on disk)."""

    def receive_data_chunk(self, raw_data, start):
        if start + len(raw_data) > settings.FILE_TRANSFER_MAX_MB * 1024 * 1024:
            self.request.upload_too_large = True
            raise StopUpload(connection_reset=False)
        return super().receive_data_chunk(raw_data, start)


@csrf_exempt  # the handler must be in place before anything reads the body; the check follows in _upload
@login_required
@require_POST
def instance_file_upload(request, instance_id: int):
    request.upload_handlers = [LimitedUpload(request)]
    return _upload(request, instance_id)


@csrf_protect
def _upload(request, instance_id: int):
    instance = _owned(request, instance_id)
    folder = request.POST.get("dir", files.ROOTS[0])  # reading the body runs LimitedUpload
    upload = request.FILES.get("file")
    if getattr(request, "upload_too_large", False):
        messages.error(request, _("Files are limited to %(mb)s MB each.") % {"mb": settings.FILE_TRANSFER_MAX_MB})
        return redirect(reverse("console-instance-files", args=[instance.pk]))
    try:
        if upload is None:
            raise ServiceError("choose a file to upload", field="file")
        where = files.upload(instance.workload, folder, upload.name, upload, user=request.user)
        messages.success(request, _("Uploaded %(where)s.") % {"where": where})
    except ServiceError as exc:
        messages.error(request, exc.message)
    return redirect(reverse("console-instance-files", args=[instance.pk]) + "?" + urlencode({"path": folder}))
