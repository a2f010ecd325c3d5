"""The SDK's errors: one per way a call fails, each with the CLI exit code scripts rely on."""

from __future__ import annotations

import httpx

# Exit codes of the CLI (documented in `gpucloud --help` and docs/cli.md).
EXIT_OK, EXIT_API, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_AUTH = 0, 1, 2, 3, 4


class GpuCloudError(Exception):
    """Anything the SDK raises on purpose."""

    exit_code = EXIT_API


class ConfigError(GpuCloudError):
    """No URL or token configured (run ``gpucloud login``), or a bad config file."""

    exit_code = EXIT_AUTH


class ApiError(GpuCloudError):
    """The API refused the request: ``status`` (HTTP), ``detail`` (its sentence), ``field`` (the input at fault)."""

    def __init__(self, status: int, detail: str, *, field: str | None = None, body: object = None):
        super().__init__(f"{field}: {detail}" if field else detail)
        self.status, self.detail, self.field, self.body = status, detail, field, body


class NotFound(ApiError):
    """404: no such object of yours (or a route this server does not have)."""

    exit_code = EXIT_NOT_FOUND


class AuthError(ApiError):
    """401 / 403: no credentials, a wrong or revoked token, or not allowed."""

    exit_code = EXIT_AUTH


class BadResponse(ApiError):
    """The server answered, but not with what this client reads: not JSON (an HTML error page, a body cut
    short), or JSON of another shape. The message names the request and shows how the answer began."""

    def __init__(self, response, why: str):
        request, text = response.request, response.text
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        start = " ".join(text[:80].split())
        shown = f"{kind}, {len(response.content)} bytes" + (f": {start!r}" if start else "")
        super().__init__(
            response.status_code, f"the server's answer to {request.method} {request.url.path} {why} ({shown})"
        )


def transport_error(url: str, exc: Exception) -> ApiError:
    """The error for an HTTP exchange that failed below HTTP (httpx's ``TransportError`` and kin)."""
    said = str(exc) or type(exc).__name__
    # Reset, closed before or inside the answer (fewer bytes than its Content-Length), silent while it came.
    if isinstance(exc, (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadTimeout)):
        return ApiError(0, f"the connection to {url} broke before the whole answer came: {said}")
    return ApiError(0, f"cannot reach {url}: {said}")


def error_for(status: int, body: object) -> ApiError:
    """The error for a non-2xx answer; ``body`` is the decoded JSON (or text)."""
    detail, field = f"HTTP {status}", None
    if isinstance(body, dict):
        detail = str(body.get("detail") or detail)
        for key, value in body.items():
            if key != "detail":
                field = key
                if "detail" not in body:
                    detail = str(value[0] if isinstance(value, list) and value else value)
                break
    elif isinstance(body, list) and body:
        detail = str(body[0])
    elif isinstance(body, str) and body.strip():  # not the API's JSON: a proxy's page, say
        detail = f"{detail}: {' '.join(body.split())[:120]}"
    kind = NotFound if status == 404 else AuthError if status in (401, 403) else ApiError
    return kind(status, detail, field=field, body=body)
