"""``Idempotency-Key`` on create requests: a retried request creates one thing and gets the first answer."""

import hashlib
import json

from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from rest_framework.response import Response

from core.errors import Conflict, InvalidInput
from portal.models import IdempotencyKey

HEADER = "Idempotency-Key"


def idempotent(request, *, endpoint: str, create) -> Response:
    """Answer ``create()`` once per (user, key); later requests with that key get the same answer.

    The key row and what ``create`` writes commit together. A concurrent twin waits on
    the key's unique index until the first commits, then reads its answer. Errors are
    not remembered: the transaction rolls back, and a retry runs again.
    """
    key = request.headers.get(HEADER)
    if key is None:
        return create()
    if not 1 <= len(key) <= 255:
        raise InvalidInput("must be 1 to 255 characters", field=HEADER)
    digest = fingerprint(request.data)
    with transaction.atomic():
        record, created = IdempotencyKey.objects.get_or_create(
            owner=request.user, key=key, defaults={"endpoint": endpoint, "request_hash": digest}
        )
        if not created:
            if (record.endpoint, record.request_hash) != (endpoint, digest):
                raise Conflict(f"this {HEADER} was already used for a different request")
            return Response(record.response, status=record.status_code)
        response = create()
        record.status_code, record.response = response.status_code, response.data
        record.save(update_fields=["status_code", "response"])
    return response


def fingerprint(data) -> str:
    """The sha256 of a request's fields; an uploaded file (a job's code) counts by its bytes, not its name, so
    one key with other code is a different request."""
    if hasattr(data, "lists"):  # a form: every value of every field, files as the sha256 of their content
        data = {key: [file_digest(v) if isinstance(v, UploadedFile) else v for v in vs] for key, vs in data.lists()}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def file_digest(upload: UploadedFile) -> str:
    digest = hashlib.sha256()
    for chunk in upload.chunks():
        digest.update(chunk)
    upload.seek(0)  # create() reads it next
    return f"sha256:{digest.hexdigest()}"
