"""Load the demo catalog, a demo user and an admin, each with a demo credit (idempotent)."""

from decimal import Decimal

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from billing.ledger import user_account, wallet_credit
from billing.models import PostingKind
from portal.services.demo import STANDIN_NAME, catalog_load, stand_in_load
from portal.services.tokens import token_create

DEMO_CREDIT = Decimal("500.00")

DEMO_USERS = [("demo", "demo-pass-123", False), ("admin", "admin-pass-123", True)]


class Command(BaseCommand):
    help = "Load the demo catalog (GPU types, images), the user demo and the admin admin."

    def add_arguments(self, parser):
        parser.add_argument(
            "--stand-in", action="store_true", help=f"Also offer {STANDIN_NAME!r} (checks that need no framework)."
        )

    def handle(self, *args, stand_in=False, **options):
        catalog_load()
        if stand_in:
            stand_in_load()
        User = get_user_model()
        for username, password, staff in DEMO_USERS:
            user, created = User.objects.get_or_create(
                username=username, defaults={"is_staff": staff, "is_superuser": staff}
            )
            if created:
                user.set_password(password)
                user.save()
            wallet_credit(
                account=user_account(user),
                amount=DEMO_CREDIT,
                kind=PostingKind.CREDIT,
                memo="demo credit",
                by=None,
                idempotency_key=f"demo-credit-{username}",
            )
            user.api_tokens.filter(name="demo").delete()  # only its digest is kept: a new one to print
            _, key = token_create(user=user, name="demo")
            self.stdout.write(f"user {username} / {password}  API token {key}")
