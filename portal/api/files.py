"""Files of a running instance or job over the API (token auth): list, download, upload — through its host's relay.

The same operations as the console's files pages (``portal/services/files.py``: the relay,
the roots under /root, the size cap, the session slots), for scripts and the CLI's
``cp``. Only the owner may (staff too get 404: it is a look inside someone's
container); a job while it runs, and once it has ended, until it is released, its disk (JOB_CHECKPOINT_PATH)
to list and download (the agent's relay reads it through a helper; 409 for an upload then).

    GET  …/files/?path=DIR                    {"path", "entries": [{name, path, dir, link, size}], "truncated"}
    GET  …/files/download/?path=FILE          the bytes (Content-Length, Content-Disposition)
    PUT  …/files/upload/?path=DIR&name=NAME   the body is the file's bytes; 201 {"path"}
    POST …/files/upload/?path=DIR             multipart/form-data with a ``file`` (its name is kept)
"""

from __future__ import annotations

import tempfile

from django.conf import settings
from django.http import StreamingHttpResponse
from django.utils.http import content_disposition_header
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.parsers import FileUploadParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from core.errors import InvalidInput
from portal import selectors
from portal.services import files

PATH = OpenApiParameter(
    "path", str, required=False, description="An absolute path under /root (default: the data disk)."
)
NAME = OpenApiParameter("name", str, required=False, description="PUT: the new file's name in ``path``.")
CHUNK = 1024 * 1024


def _workload(request, kind: str, ids: dict):
    """The owner's running work named by the route (``instance_id`` or ``job_id``); NotFound for anyone else."""
    if kind == "job":
        return selectors.job_get_owned(user=request.user, job_id=ids["job_id"]).workload
    return selectors.instance_get_owned(user=request.user, instance_id=ids["instance_id"]).workload


class _Spooled:
    """A request body read to a temporary file, up to FILE_TRANSFER_MAX_MB: what ``files.upload`` streams."""

    def __init__(self, request):
        limit = settings.FILE_TRANSFER_MAX_MB * 1024 * 1024
        self.file = tempfile.SpooledTemporaryFile(max_size=CHUNK)  # noqa: SIM115  (closed by the view)
        self.size = 0
        while chunk := request.read(CHUNK):
            self.size += len(chunk)
            if self.size > limit:
                self.file.close()
                raise InvalidInput(f"at most {settings.FILE_TRANSFER_MAX_MB} MB per file", field="file")
            self.file.write(chunk)

    def seek(self, offset: int) -> None:
        self.file.seek(offset)

    def read(self, size: int) -> bytes:
        return self.file.read(size)

    def close(self) -> None:
        self.file.close()


class FileListApi(APIView):
    kind = "instance"

    class ListingOutput(serializers.Serializer):
        class EntryOutput(serializers.Serializer):
            name = serializers.CharField()
            path = serializers.CharField()
            dir = serializers.BooleanField()
            link = serializers.BooleanField()
            size = serializers.IntegerField(allow_null=True)

        path = serializers.CharField()
        entries = EntryOutput(many=True)
        truncated = serializers.BooleanField(help_text="The folder holds more entries than a listing returns.")

    @extend_schema(parameters=[PATH], responses=ListingOutput)
    def get(self, request, **ids):
        workload = _workload(request, self.kind, ids)
        path = files.safe_path(request.query_params.get("path") or files.ROOTS[0])
        entries, truncated = files.listing(workload, path, user=request.user)
        return Response(self.ListingOutput({"path": path, "entries": entries, "truncated": truncated}).data)


class FileDownloadApi(APIView):
    kind = "instance"

    @extend_schema(parameters=[PATH], responses={(200, "application/octet-stream"): OpenApiTypes.BINARY})
    def get(self, request, **ids):
        workload = _workload(request, self.kind, ids)
        name, size, chunks = files.download(workload, request.query_params.get("path", ""), user=request.user)
        response = StreamingHttpResponse(chunks, content_type="application/octet-stream")
        response["Content-Length"] = str(size)
        response["Content-Disposition"] = content_disposition_header(True, name)
        return response


class FileUploadApi(APIView):
    kind = "instance"
    parser_classes = [MultiPartParser, FileUploadParser]  # documented; PUT reads the raw body itself

    class UploadOutput(serializers.Serializer):
        path = serializers.CharField(help_text="Where the file now is.")

    @extend_schema(
        parameters=[PATH, NAME],
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={201: UploadOutput},
    )
    def put(self, request, **ids):
        workload = _workload(request, self.kind, ids)
        name = request.query_params.get("name", "")
        if not name:
            raise InvalidInput("name the new file (?name=...)", field="name")
        body = _Spooled(request._request)
        try:
            where = files.upload(
                workload, request.query_params.get("path", files.ROOTS[0]), name, body, user=request.user
            )
        finally:
            body.close()
        return Response(self.UploadOutput({"path": where}).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        parameters=[PATH],
        request={
            "multipart/form-data": {"type": "object", "properties": {"file": {"type": "string", "format": "binary"}}}
        },
        responses={201: UploadOutput},
    )
    def post(self, request, **ids):
        workload = _workload(request, self.kind, ids)
        upload = request.FILES.get("file")
        if upload is None:
            raise InvalidInput("send the file as the form field 'file'", field="file")
        if upload.size > settings.FILE_TRANSFER_MAX_MB * 1024 * 1024:
            raise InvalidInput(f"at most {settings.FILE_TRANSFER_MAX_MB} MB per file", field="file")
        where = files.upload(
            workload, request.query_params.get("path", files.ROOTS[0]), upload.name, upload, user=request.user
        )
        return Response(self.UploadOutput({"path": where}).data, status=status.HTTP_201_CREATED)
