"""Template context every page needs."""

from django.conf import settings


def websocket_url(request) -> dict:
    return {"websocket_url": settings.WEBSOCKET_URL}


def wallet(request) -> dict:
    """The signed-in user's balance and this month's spend, for the header (with its warning, if any)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or getattr(request, "htmx", False):
        return {}
    from billing.enforcement import standing
    from billing.ledger import user_account

    account = user_account(user)
    return {"wallet": standing(account), "wallet_currency": account.currency}
