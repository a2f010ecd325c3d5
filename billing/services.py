"""Money changed by people: top-ups (a permission, a reason, once per key) and monthly budgets (one validation).

The console, the admin and the API all come through here, so a rule holds whatever
the door. Every top-up is a ledger posting that carries who made it (``created_by``),
when (``created_at``) and why (``memo``): the ledger is its own audit trail. Nobody tops up a wallet
of their own (theirs, or a team's they belong to) beyond SELF_TOP_UP_MAX, and more than
TOP_UP_APPROVAL_ABOVE waits, as a TopUpRequest, for a second holder of the permission to approve it.
"""

from __future__ import annotations

import hashlib
from decimal import Decimal, InvalidOperation

from django.db import transaction

from billing.ledger import wallet_credit
from billing.models import MONEY, Account, Membership, Posting, TopUpRequest
from core.errors import Conflict, Forbidden, InvalidInput, NotFound

TOP_UP_PERMISSION = "billing.top_up"  # Posting.Meta.permissions: being staff is not enough to make money
MAX_KEY = 255  # an Idempotency-Key's longest
SELF_TOP_UP_MAX = Decimal("10.00")  # into one's own wallet (or one's team's): a test credit, not a salary
TOP_UP_APPROVAL_ABOVE = Decimal("1000.00")  # more than this takes two people: one asks, another approves


def posting_key(*, scope: str, key: str) -> str:
    """The ledger's unique key for a client's key: a fixed-length digest, so any key up to MAX_KEY fits."""
    if not 1 <= len(key) <= MAX_KEY:
        raise InvalidInput(f"must be 1 to {MAX_KEY} characters", field="Idempotency-Key")
    return f"{scope}:{hashlib.sha256(key.encode()).hexdigest()}"


def wallet_top_up(
    *, account: Account, amount: Decimal, kind: str, reason: str, by, idempotency_key: str | None = None
) -> tuple[Posting | TopUpRequest, bool]:
    """Top up, credit or refund ``account`` on behalf of ``by``; returns (posting, created).

    ``by`` needs the ``billing.top_up`` permission. ``idempotency_key`` comes from
    ``posting_key``: the same key again returns the first posting and credits nothing.
    More than TOP_UP_APPROVAL_ABOVE posts nothing: it returns a pending TopUpRequest (once per key)
    for another holder of the permission to approve (``top_up_approve``).
    """
    reason = _check_top_up(account=account, amount=amount, reason=reason, by=by)
    if amount > TOP_UP_APPROVAL_ABOVE:
        fields = dict(account=account, amount=amount, kind=kind, memo=reason, requested_by=by)
        if idempotency_key is None:
            return TopUpRequest.objects.create(**fields), True
        return TopUpRequest.objects.get_or_create(idempotency_key=idempotency_key, defaults=fields)
    return wallet_credit(account=account, amount=amount, kind=kind, memo=reason, by=by, idempotency_key=idempotency_key)


def top_up_approve(*, request_id: int, by) -> Posting:
    """Post a pending TopUpRequest as ``by``, who holds the permission and did not ask for it; approving an
    approved one again returns its posting."""
    if by is None or not by.is_active or not by.has_perm(TOP_UP_PERMISSION):
        raise Forbidden("only accounts with the top-up permission can approve a top-up")
    with transaction.atomic():
        request = TopUpRequest.objects.select_for_update().select_related("account").filter(pk=request_id).first()
        if request is None:
            raise NotFound("no such top-up request")
        if request.posting_id is not None:
            return request.posting
        if by.pk == request.requested_by_id:
            raise Conflict("a top-up you asked for is approved by another holder of the top-up permission")
        _check_top_up(account=request.account, amount=request.amount, reason=request.memo, by=by)
        posting, _ = wallet_credit(
            account=request.account,
            amount=request.amount,
            kind=request.kind,
            memo=request.memo,
            by=by,
            idempotency_key=f"top-up-request:{request.pk}",
        )
        request.approved_by, request.posting = by, posting
        request.save(update_fields=["approved_by", "posting"])
    return posting


def _check_top_up(*, account: Account, amount: Decimal, reason: str, by) -> str:
    """The reason, stripped, if ``by`` may put ``amount`` into ``account``; the rule's error if not."""
    if by is None or not by.is_active or not by.has_perm(TOP_UP_PERMISSION):
        raise Forbidden("only accounts with the top-up permission can move money into a wallet")
    if amount > SELF_TOP_UP_MAX and wallet_is_own(account, by):
        raise InvalidInput(
            f"at most {SELF_TOP_UP_MAX} into a wallet of your own or of your team: another holder of the top-up "
            "permission must do it",
            field="amount",
        )
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("say why (shown to the wallet's owner and kept in the ledger)", field="memo")
    return reason


def wallet_is_own(account: Account, person) -> bool:
    """Whether ``account`` is ``person``'s wallet, or the wallet of a team ``person`` belongs to."""
    if account.user_id is not None:
        return account.user_id == person.pk
    return account.team_id is not None and Membership.objects.filter(team_id=account.team_id, user=person).exists()


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
