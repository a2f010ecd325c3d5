"""One place that shapes errors for the API.

Service errors (``core.errors``) answer with their own status: 400 ``{"<field>": ["message"],
"detail": "message"}``, and 402, 403, 404, 409 or 429 ``{"detail": ...}`` (with the field too where
one is at fault); DRF's own errors keep its shape, and a body that is not JSON names ``body`` as the
field at fault.
"""

from rest_framework.exceptions import ParseError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from core.errors import ServiceError


def exception_handler(exc, context):
    if isinstance(exc, ServiceError):
        body = {"detail": exc.message}
        if exc.field:
            body[exc.field] = [exc.message]
        return Response(body, status=exc.status_code)
    response = drf_exception_handler(exc, context)
    if isinstance(exc, ParseError) and response is not None:
        response.data["body"] = [response.data["detail"]]  # the field at fault is the request body itself
    return response
