"""The one application error type every service raises, and its kinds.

The API shapes them once (portal.api.errors): 400 naming the field, 403 for an
action the caller lacks the permission for, 404 for what the caller may not see,
409 for a conflict with the current state, 429 for a per-user limit reached.
"""


class ServiceError(Exception):
    status_code = 400

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidInput(ServiceError):
    status_code = 400


class Forbidden(ServiceError):
    """The caller is known but lacks the permission an action needs (a money action without ``billing.top_up``)."""

    status_code = 403


class NotFound(ServiceError):
    status_code = 404


class Conflict(ServiceError):
    status_code = 409


class PaymentRequired(ServiceError):
    """The paying account has no money left, or reached its budget: 402, with what to do."""

    status_code = 402


class TooMany(ServiceError):
    """A per-user limit (queued work) is reached: 429, with a sentence saying what to do."""

    status_code = 429
