"""The ledger: accounts, postings between them, and the check that balances are sums of postings.

Every movement of money is ``transfer``: one append-only ``Posting`` and the two
balances moved in the same transaction (balances are updated with ``F()``, so
concurrent transfers add up). Top-ups, refunds and credits carry who made them,
why, and an idempotency key (the same key twice is one top-up).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import F, Sum

from billing.models import ZERO, Account, AccountKind, Posting, PostingKind, Team
from billing.rating import cents
from core.errors import InvalidInput


def platform_account(kind: str) -> Account:
    account, _ = Account.objects.get_or_create(kind=kind)
    return account


def user_account(user) -> Account:
    account, _ = Account.objects.get_or_create(kind=AccountKind.USER, user=user)
    return account


def team_account(team: Team) -> Account:
    account, _ = Account.objects.get_or_create(kind=AccountKind.TEAM, team=team)
    return account


def payer_for(*, owner_id: int, team_slug: str) -> Account:
    """The account a workload is charged to: its team's when it runs for a team, else its owner's."""
    if team_slug:
        team = Team.objects.filter(slug=team_slug).first()
        if team is not None:
            return team_account(team)
    account, _ = Account.objects.get_or_create(kind=AccountKind.USER, user_id=owner_id)
    return account


def transfer(*, debit: Account, credit: Account, amount: Decimal, kind: str, **fields) -> Posting:
    if amount < 0:
        raise InvalidInput("an amount moved is never negative: swap the accounts", field="amount")
    with transaction.atomic():
        posting = Posting.objects.create(
            debit=debit, credit=credit, amount=amount, kind=kind, currency=credit.currency, **fields
        )
        Account.objects.filter(pk=debit.pk).update(balance=F("balance") - amount)
        Account.objects.filter(pk=credit.pk).update(balance=F("balance") + amount)
    return posting


SOURCES = {
    PostingKind.TOPUP: AccountKind.FUNDING,  # money paid in
    PostingKind.CREDIT: AccountKind.PROMOTION,  # granted by the platform
    PostingKind.REFUND: AccountKind.REVENUE,  # usage money given back
}


def wallet_credit(
    *, account: Account, amount: Decimal, kind: str, memo: str, by, idempotency_key: str | None = None
) -> tuple[Posting, bool]:
    """Top up, credit or refund a wallet; returns (posting, created). A repeated key returns the first posting."""
    if kind not in SOURCES:
        raise InvalidInput(f"kind must be one of {', '.join(SOURCES)}", field="kind")
    if amount <= 0:
        raise InvalidInput("the amount must be more than zero", field="amount")
    if account.kind not in (AccountKind.USER, AccountKind.TEAM):
        raise InvalidInput("only user and team wallets take top-ups", field="account")
    if idempotency_key:
        earlier = Posting.objects.filter(idempotency_key=idempotency_key).first()
        if earlier is not None:
            _same_request(earlier, account, amount, kind)
            return earlier, False
    try:
        posting = transfer(
            debit=platform_account(SOURCES[kind]),
            credit=account,
            amount=amount,
            kind=kind,
            memo=memo[:255],
            created_by=by,
            idempotency_key=idempotency_key or None,
        )
    except IntegrityError:  # the same key, concurrently: the other request made it
        earlier = Posting.objects.get(idempotency_key=idempotency_key)
        _same_request(earlier, account, amount, kind)
        return earlier, False
    return posting, True


def _same_request(earlier: Posting, account: Account, amount: Decimal, kind: str) -> None:
    if (earlier.credit_id, earlier.amount, earlier.kind) != (account.pk, amount, kind):
        raise InvalidInput("this Idempotency-Key was used for a different request", field="idempotency_key")


@dataclass(frozen=True)
class LedgerCheck:
    debits: Decimal
    credits: Decimal
    mismatched: list[tuple[int, Decimal, Decimal]]  # (account id, balance, sum of postings)

    @property
    def ok(self) -> bool:
        return self.debits == self.credits and not self.mismatched


def ledger_check() -> LedgerCheck:
    """Debits = credits over all postings, and every balance = credits in - debits out."""
    ins, outs = (
        {account: cents(amount) for account, amount in Posting.objects.values_list(side).annotate(s=Sum("amount"))}
        for side in ("credit", "debit")
    )  # cents(): SQLite sums decimals as floats
    mismatched = []
    for account_id, balance in Account.objects.values_list("pk", "balance"):
        expected = (ins.get(account_id) or ZERO) - (outs.get(account_id) or ZERO)
        if balance != expected:
            mismatched.append((account_id, balance, expected))
    # Each row moves its amount out of one account and into another, so the two sums agree by
    # construction; adding them up separately shows it, and catches a row edited by hand.
    return LedgerCheck(debits=sum(outs.values(), ZERO), credits=sum(ins.values(), ZERO), mismatched=mismatched)
