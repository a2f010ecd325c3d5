"""GET /api/v1/jobs/<id>/logs/ and /api/v1/instances/<id>/logs/: a workload's log, streamed.

Query: ``tail``, ``since``, ``after``, ``rank`` (``portal.services.logs.query_parse``); ``format=ndjson`` (default: one
line object a line, then ``{"end": ...}``) or ``format=text`` (the lines' text; ``download=1`` makes
it an attachment). The owner only: anyone else gets 404. A user has at most ``LOG_READS_PER_USER`` reads
under way at once (``portal.services.logs.log_read``); one more is 429 saying so. Errors before the first
byte (a bad query, a host that does not answer) are the API's usual shapes; a read cut short later lacks
its end line.
"""

import json
from collections.abc import Iterator

from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.views import APIView

from portal.services import logs


class _JsonBody(BaseRenderer):
    """The two formats a log is asked for in (``format=``); logs bypass rendering, errors go out as JSON."""

    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return json.dumps(data).encode()


class NdjsonRenderer(_JsonBody):
    media_type, format = "application/x-ndjson", "ndjson"


class TextRenderer(_JsonBody):
    media_type, format = "text/plain", "text"


PARAMETERS = [
    OpenApiParameter("tail", int, description="the last N lines"),
    OpenApiParameter("since", str, description="ISO-8601 time, or a duration back from now: 10m, 2h, 1d"),
    OpenApiParameter("after", str, description="a cursor (a line's n): the lines after it"),
    OpenApiParameter(
        "rank", int, description="a gang's member: its lines only (each line of a gang's log has rank and host)"
    ),
    OpenApiParameter("format", str, enum=["ndjson", "text"]),
    OpenApiParameter("download", int, enum=[0, 1], description="text as an attachment"),
]


class LogsApi(APIView):
    kind = ""  # "jobs" or "instances"
    renderer_classes = [NdjsonRenderer, TextRenderer]

    def handle_exception(self, exc):
        """An error is the API's usual JSON (application/json) whichever format the log was asked in."""
        response = super().handle_exception(exc)
        self.request.accepted_renderer, self.request.accepted_media_type = JSONRenderer(), "application/json"
        return response

    @extend_schema(parameters=PARAMETERS, responses={(200, "application/x-ndjson"): str, (200, "text/plain"): str})
    def get(self, request, job_id: int | None = None, instance_id: int | None = None):
        object_id = job_id if self.kind == "jobs" else instance_id
        workload = logs.log_workload(user=request.user, kind=self.kind, object_id=object_id)
        query = logs.query_parse(request.query_params)
        lines = logs.log_read(workload, query=query, user_id=request.user.pk)
        first = next(lines)  # a host that does not answer is still a 409 here; beyond the user's reads, a 429
        lines = _joined(first, lines)
        if request.query_params.get("format") == "text":
            response = StreamingHttpResponse(logs.as_text(lines), content_type="text/plain; charset=utf-8")
            if request.query_params.get("download") == "1":
                name = f"{self.kind[:-1]}-{object_id}.log"
                response["Content-Disposition"] = f'attachment; filename="{name}"'
        else:
            response = StreamingHttpResponse(lines, content_type="application/x-ndjson")
        response["X-Accel-Buffering"] = "no"  # the proxy passes lines on as they come
        return response


def _joined(first: bytes, lines: Iterator[bytes]) -> Iterator[bytes]:
    """``first`` then ``lines``; closed when the response is (a client gone), which ends the read and frees
    its slot."""
    try:
        yield first
        yield from lines
    finally:
        lines.close()
