"""The SDK's errors: one per way a call fails, each with the CLI exit code scripts rely on."""

from __future__ import annotations

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
    kind = NotFound if status == 404 else AuthError if status in (401, 403) else ApiError
    return kind(status, detail, field=field, body=body)
