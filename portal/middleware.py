"""Refuse a NUL character in a query or form value with a 400 naming the field.

No name, command or filter has a use for one, PostgreSQL's text columns cannot hold
one (the query fails: a 500), and form fields check for it (Django's CharField) only
where a view uses a form. Multipart bodies are left to their views and services (which
refuse a NUL where they store text): reading them here would run the upload handlers
before the upload view sets its own.
"""

from django.http import HttpResponseBadRequest, JsonResponse

FORM = "application/x-www-form-urlencoded"


class RefuseNulMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        values = [request.GET]
        if request.method == "POST" and request.content_type == FORM:
            values.append(request.POST)
        for query in values:
            for name, value in query.lists():
                if "\x00" in name or any("\x00" in v for v in value):
                    return _refusal(request, name.replace("\x00", "\\x00"))
        return self.get_response(request)


def _refusal(request, field: str):
    message = "a NUL character is not allowed"
    if request.path.startswith("/api/"):  # shaped as the API's other 400s (portal.api.errors): the field named
        return JsonResponse({"detail": f"{field}: {message}", field: [message]}, status=400)
    return HttpResponseBadRequest(f"{field}: {message}", content_type="text/plain")
