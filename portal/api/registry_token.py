"""``/registry/token/``: the image registry's token server (``portal.services.registry_tokens``).

A Docker engine (or the control plane) that the registry challenged asks here with HTTP basic credentials, the
registry's ``service`` name and the ``scope`` parameters it needs; the answer is Distribution's token document
(``token``, ``access_token``, ``expires_in``, ``issued_at``). Wrong or missing credentials: 401 with a Basic
challenge; a bad service or scope: 400 naming the field; token mode off (no ``REGISTRY_TOKEN_REALM``): 404.
"""

from __future__ import annotations

import base64
import binascii

from django.conf import settings
from django.http import Http404, JsonResponse
from django.views.decorators.http import require_safe

from core.errors import InvalidInput
from portal.services import registry_tokens


@require_safe
def registry_token(request):
    if not settings.REGISTRY_TOKEN_REALM:
        raise Http404("this cloud's registry does not use tokens")
    caller = _caller(request.headers.get("Authorization", ""))
    if caller is None:
        response = JsonResponse({"errors": [{"code": "UNAUTHORIZED", "message": "sign in: wrong credentials"}]})
        response.status_code = 401
        response["WWW-Authenticate"] = 'Basic realm="gpucloud registry"'
        return response
    try:
        if request.GET.get("service", "") != settings.REGISTRY_TOKEN_SERVICE:
            raise InvalidInput(f"this token server serves {settings.REGISTRY_TOKEN_SERVICE!r}", field="service")
        scopes = registry_tokens.scopes_parse(request.GET.getlist("scope"))
    except InvalidInput as exc:
        return JsonResponse({"errors": [{"code": "INVALID", "field": exc.field, "message": exc.message}]}, status=400)
    return JsonResponse(registry_tokens.token_for(caller, scopes))


def _caller(header: str) -> registry_tokens.Caller | None:
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        username, colon, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return registry_tokens.caller_of(username, password) if colon else None
