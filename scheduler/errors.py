"""The one application error type every service raises, and its three kinds.

The API shapes them once (portal.api.errors): 400 naming the field, 404 for
what the caller may not see, 409 for a conflict with the current state.
"""


class ServiceError(Exception):
    status_code = 400

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidInput(ServiceError):
    status_code = 400


class NotFound(ServiceError):
    status_code = 404


class Conflict(ServiceError):
    status_code = 409
