"""Money changed by people: top-ups (a permission, a reason, once per key) and monthly budgets (one validation).

The console, the admin and the API all come through here, so a rule holds whatever
the door. Every top-up is a ledger posting that carries who made it (``created_by``),
when (``created_at``) and why (``memo``): the ledger is its own audit trail.
"""

from __future__ import annotations

import hashlib
from decimal import Decimal, InvalidOperation

from billing.ledger import wallet_credit
from billing.models import MONEY, Account, Posting
from scheduler.errors import Forbidden, InvalidInput

TOP_UP_PERMISSION = "billing.top_up"  # Posting.Meta.permissions: being staff is not enough to make money
MAX_KEY = 255  # an Idempotency-Key's longest


def posting_key(*, scope: str, key: str) -> str:
    """The ledger's unique key for a client's key: a fixed-length digest, so any key up to MAX_KEY fits."""
    if not 1 <= len(key) <= MAX_KEY:
        raise InvalidInput(f"must be 1 to {MAX_KEY} characters", field="Idempotency-Key")
    return f"{scope}:{hashlib.sha256(key.encode()).hexdigest()}"


def wallet_top_up(
    *, account: Account, amount: Decimal, kind: str, reason: str, by, idempotency_key: str | None = None
) -> tuple[Posting, bool]:
    """Top up, credit or refund ``account`` on behalf of ``by``; returns (posting, created).

    ``by`` needs the ``billing.top_up`` permission. ``idempotency_key`` comes from
    ``posting_key``: the same key again returns the first posting and credits nothing.
    """
    if by is None or not by.is_active or not by.has_perm(TOP_UP_PERMISSION):
        raise Forbidden("only accounts with the top-up permission can move money into a wallet")
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("say why (shown to the wallet's owner and kept in the ledger)", field="memo")
    return wallet_credit(account=account, amount=amount, kind=kind, memo=reason, by=by, idempotency_key=idempotency_key)


def budget_amount(raw, *, field: str = "monthly_budget") -> Decimal | None:
    """A monthly budget or limit from a form or JSON value: an amount of 0 or more with at most two decimals, or None.

    The one check for wallets' budgets and team members' monthly limits, in the console and the API.
    """
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    digits, places = MONEY["max_digits"], MONEY["decimal_places"]
    try:
        amount = Decimal(str(raw).strip())
    except InvalidOperation:
        amount = None
    if amount is None or not amount.is_finite():
        raise InvalidInput("must be an amount (e.g. 300), or empty for no budget", field=field)
    if amount < 0:
        raise InvalidInput("must be 0 or more", field=field)
    if amount >= Decimal(10) ** (digits - places):
        raise InvalidInput(f"must be less than {Decimal(10) ** (digits - places):,}", field=field)
    if amount != amount.quantize(Decimal(1).scaleb(-places)):
        raise InvalidInput(f"at most {places} decimal places", field=field)
    return amount


def budget_set(*, account: Account, budget) -> Account:
    """Set the monthly budget (None or empty removes it): work stops when the month's spend reaches it."""
    account.monthly_budget = budget_amount(budget)
    account.save(update_fields=["monthly_budget"])
    return account
