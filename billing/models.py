"""Billing: metering segments, accounts and teams, rate cards, spot prices, and the ledger.

Money is ``Decimal`` with two places (the currency's cent); every movement is
one ``Posting`` from a debit account to a credit account, so debits equal
credits by construction. Postings are append-only (a PostgreSQL trigger
refuses UPDATE and DELETE). ``Account.balance`` is kept in the same
transaction as each posting and checked against the sum of postings by
``billing.ledger.ledger_check``.
"""

from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _

from scheduler.models import Workload

ZERO = Decimal("0.00")
MONEY = dict(max_digits=14, decimal_places=2)
RATE = dict(max_digits=12, decimal_places=4, validators=[MinValueValidator(Decimal(0))])


class Team(models.Model):
    """An organization whose members' work is charged to the team's account."""

    slug = models.SlugField(max_length=64, unique=True, help_text="Also the scheduler's team (quotas, fair share).")
    name = models.CharField(max_length=128)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return self.name


class Membership(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    is_admin = models.BooleanField(default=False)
    monthly_limit = models.DecimalField(
        **MONEY, null=True, blank=True, help_text="Most this member may spend from the team per month; empty: no limit."
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_membership_per_team")]

    def __str__(self):
        return f"{self.user} in {self.team}"


class TeamInvitation(models.Model):
    """A team admin asked ``user`` to join; they become a member when they accept (never without their consent)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="invitations")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_invitations")
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_invitation_per_team")]

    def __str__(self):
        return f"{self.user} invited to {self.team}"


class AccountKind(models.TextChoices):
    USER = "user", _("User wallet")
    TEAM = "team", _("Team wallet")
    REVENUE = "revenue", _("Revenue")
    FUNDING = "funding", _("Top-ups received (money in)")
    PROMOTION = "promotion", _("Credits granted")


class Account(models.Model):
    """Who pays (a user's or a team's wallet), or one of the platform's own accounts."""

    kind = models.CharField(max_length=16, choices=AccountKind.choices)
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="account"
    )
    team = models.OneToOneField(Team, null=True, blank=True, on_delete=models.PROTECT, related_name="account")
    currency = models.CharField(max_length=3, default="CNY")
    balance = models.DecimalField(**MONEY, default=ZERO, help_text="Sum of its postings (credits - debits).")
    monthly_budget = models.DecimalField(
        **MONEY, null=True, blank=True, help_text="Warn at 80 %, stop running work at 100 % of this per month."
    )
    low_balance_since = models.DateTimeField(
        null=True, blank=True, help_text="When the balance (with unsettled usage) reached zero: the grace starts."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(Q(kind="user") & Q(user__isnull=False) & Q(team__isnull=True))
                | (Q(kind="team") & Q(team__isnull=False) & Q(user__isnull=True))
                | (~Q(kind__in=["user", "team"]) & Q(user__isnull=True) & Q(team__isnull=True)),
                name="account_owner_matches_kind",
            ),
            models.UniqueConstraint(
                fields=["kind"], condition=~Q(kind__in=["user", "team"]), name="one_platform_account_per_kind"
            ),
        ]

    def __str__(self):
        owner = self.user or self.team or self.get_kind_display()
        return f"{owner} ({self.balance} {self.currency})"


class RateCard(models.Model):
    """Prices from ``effective_from`` on, for one GPU type (``gpu_model``) or, blank, for everything else.

    Rows are never edited once in force: a new price is a new row with a later
    ``effective_from``, so the past keeps the rate it was charged at.
    """

    gpu_model = models.CharField(max_length=64, blank=True, help_text="Blank: the default card (CPU-only, storage).")
    effective_from = models.DateTimeField()
    card_hour = models.DecimalField(**RATE, default=Decimal(0), help_text="On-demand price of one card for one hour.")
    spot_floor = models.DecimalField(
        max_digits=4, decimal_places=3, default=Decimal("0.33"), help_text="Spot price at an idle cluster, x on-demand."
    )
    spot_ceiling = models.DecimalField(
        max_digits=4, decimal_places=3, default=Decimal("0.70"), help_text="Spot price at a full cluster, x on-demand."
    )
    cpus_per_card = models.PositiveIntegerField(default=8, help_text="CPU cores included with each card.")
    memory_gb_per_card = models.PositiveIntegerField(default=32, help_text="Memory included with each card.")
    cpu_core_hour = models.DecimalField(**RATE, default=Decimal("0.05"), help_text="Each core beyond the allotment.")
    memory_gb_hour = models.DecimalField(**RATE, default=Decimal("0.01"), help_text="Each GB beyond the allotment.")
    no_gpu_hour = models.DecimalField(**RATE, default=Decimal("0.10"), help_text="An instance started without a GPU.")
    storage_gb_day = models.DecimalField(**RATE, default=Decimal("0.01"), help_text="Data disk per GB-day.")
    free_storage_gb = models.PositiveIntegerField(default=20)
    currency = models.CharField(max_length=3, default="CNY")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)

    class Meta:
        ordering = ["gpu_model", "-effective_from"]
        constraints = [
            models.UniqueConstraint(fields=["gpu_model", "effective_from"], name="one_rate_per_model_and_time"),
            models.CheckConstraint(
                condition=Q(spot_floor__gt=0) & Q(spot_floor__lte=F("spot_ceiling")) & Q(spot_ceiling__lte=1),
                name="spot_band_within_on_demand",
            ),
        ]

    def __str__(self):
        return f"{self.gpu_model or 'default'} from {self.effective_from:%Y-%m-%d %H:%M}: {self.card_hour}/card-hour"


class SpotPrice(models.Model):
    """The spot price of a GPU type from ``effective_from`` on (recomputed on a schedule from cluster load)."""

    gpu_model = models.CharField(max_length=64)
    effective_from = models.DateTimeField()
    card_hour = models.DecimalField(**RATE)
    load = models.FloatField(help_text="Share of the type's cards allocated when it was computed, 0..1.")

    class Meta:
        ordering = ["gpu_model", "-effective_from"]
        constraints = [models.UniqueConstraint(fields=["gpu_model", "effective_from"], name="one_spot_price_per_time")]

    def __str__(self):
        return f"{self.gpu_model} spot {self.card_hour} from {self.effective_from:%H:%M}"


class MeterSegment(models.Model):
    """Opened when the container is really running, closed when it really stops."""

    # No index of its own: one_segment_per_run (workload, started_at) serves lookups by workload, and
    # settling updates 100,000 segments an hour, each update writing an entry into every index.
    workload = models.ForeignKey(Workload, on_delete=models.PROTECT, related_name="meter_segments", db_index=False)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=255, blank=True)
    account = models.ForeignKey(
        Account, null=True, blank=True, on_delete=models.PROTECT, related_name="segments", help_text="Who pays."
    )
    rate_card = models.ForeignKey(
        RateCard,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
        help_text="In force at the start.",
    )
    settled_until = models.DateTimeField(null=True, blank=True, help_text="Charged up to here.")
    no_gpu = models.BooleanField(default=False, help_text="A run without its cards: the no-GPU price.")
    spot = models.BooleanField(
        default=False, help_text="Ran on spot capacity: the spot price (its work may have fallen back since)."
    )
    cards = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        help_text="Cards held through the run (an elastic job's size changes between runs); empty: its work's.",
    )

    class Meta:
        ordering = ["started_at"]
        constraints = [
            models.UniqueConstraint(fields=["workload"], condition=Q(ended_at__isnull=True), name="one_open_segment"),
            models.UniqueConstraint(fields=["workload", "started_at"], name="one_segment_per_run"),
            models.CheckConstraint(
                condition=Q(ended_at__isnull=True) | Q(ended_at__gte=models.F("started_at")),
                name="segment_ends_after_start",
            ),
        ]

    def __str__(self):
        return f"{self.workload_id}: {self.started_at} .. {self.ended_at or 'open'}"

    @property
    def seconds(self) -> float | None:
        return None if self.ended_at is None else (self.ended_at - self.started_at).total_seconds()


class PostingKind(models.TextChoices):
    USAGE = "usage", _("Usage (GPU, CPU, memory)")
    STORAGE = "storage", _("Storage")
    TOPUP = "topup", _("Top-up")
    REFUND = "refund", _("Refund")
    CREDIT = "credit", _("Credit")
    ADJUSTMENT = "adjustment", _("Adjustment")


class Posting(models.Model):
    """One movement of money from ``debit`` to ``credit``. Append-only.

    A usage posting is unique per (segment, period): settling again, after a
    crash or concurrently, cannot charge a period twice. A top-up is unique
    per idempotency key.
    """

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    kind = models.CharField(max_length=16, choices=PostingKind.choices)
    # The accounts and the segment a posting names are checked once per statement on PostgreSQL, not by
    # foreign keys: a foreign key checks (and locks) its target once per row, which made the checks at
    # the commit of a settlement cost as much as writing its postings. The trigger
    # (migration 0009) refuses a statement that names a missing one; those rows are never deleted.
    debit = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="debits", db_constraint=False)
    credit = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="credits", db_constraint=False)
    amount = models.DecimalField(**MONEY)
    currency = models.CharField(max_length=3, default="CNY")
    # Usage: what was charged.
    # No index of its own: one_charge_per_period (segment, period_start) serves lookups by segment.
    segment = models.ForeignKey(
        MeterSegment,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="postings",
        db_index=False,
        db_constraint=False,
    )
    period_start = models.DateTimeField(null=True, blank=True, help_text="Usage/storage: the hour (or day) charged.")
    seconds = models.FloatField(null=True, blank=True, help_text="Usage: seconds billed in the period.")
    gpu_seconds = models.FloatField(null=True, blank=True, help_text="Usage: seconds x cards held.")
    detail = models.JSONField(default=dict, blank=True, help_text="Rates and pieces the amount came from.")
    # Top-ups, refunds, credits: who and why.
    idempotency_key = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001  (NULL: no key)
    memo = models.CharField(max_length=255, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, db_index=False
    )

    class Meta:
        ordering = ["created_at", "id"]
        # Making money is its own permission (billing.services.TOP_UP_PERMISSION), not part of being staff.
        permissions = [("top_up", "Can top up, credit or refund a wallet")]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gte=0), name="posting_amount_not_negative"),
            models.CheckConstraint(condition=~Q(debit=F("credit")), name="posting_between_two_accounts"),
            models.UniqueConstraint(
                fields=["segment", "period_start"], condition=Q(segment__isnull=False), name="one_charge_per_period"
            ),
            models.UniqueConstraint(
                fields=["debit", "period_start"], condition=Q(kind="storage"), name="one_storage_charge_per_day"
            ),
            # Partial, as the others: usage postings (nearly all rows) add no entry to these indexes.
            models.UniqueConstraint(
                fields=["idempotency_key"], condition=Q(idempotency_key__isnull=False), name="one_posting_per_key"
            ),
        ]

    def __str__(self):
        return f"{self.kind} {self.amount} {self.currency}: {self.debit_id} -> {self.credit_id}"


class TopUpRequest(models.Model):
    """A top-up past ``billing.services.TOP_UP_APPROVAL_ABOVE``: posted only when another holder of the top-up
    permission approves it (``top_up_approve``); until then it moves no money."""

    created_at = models.DateTimeField(auto_now_add=True)
    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="top_up_requests")
    amount = models.DecimalField(**MONEY)
    kind = models.CharField(max_length=16, choices=PostingKind.choices)
    memo = models.CharField(max_length=255)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    idempotency_key = models.CharField(max_length=128, null=True, blank=True, unique=True)  # noqa: DJ001
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    posting = models.OneToOneField(Posting, null=True, blank=True, on_delete=models.PROTECT, related_name="+")

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="top_up_request_amount_positive"),
            models.CheckConstraint(condition=~Q(approved_by=F("requested_by")), name="top_up_approved_by_another"),
            models.CheckConstraint(
                condition=Q(approved_by__isnull=True, posting__isnull=True)
                | Q(approved_by__isnull=False, posting__isnull=False),
                name="top_up_posted_when_approved",
            ),
        ]

    def __str__(self):
        state = "approved" if self.posting_id else "pending"
        return f"{self.kind} {self.amount} to {self.account} ({state})"


class SharedStorageUsage(models.Model):
    """A user's shared file storage (``/root/autodl-fs``) on one UTC day, as sampled from JuiceFS.

    ``peak_bytes`` is the most it held at any sample that day (what the day is
    charged for); ``used_bytes`` and ``quota_bytes`` are the latest sample's.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="shared_storage_days")
    day = models.DateField()
    peak_bytes = models.BigIntegerField(default=0)
    used_bytes = models.BigIntegerField(default=0)
    quota_bytes = models.BigIntegerField(default=0)
    sampled_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "day"], name="one_shared_storage_row_per_day")]

    def __str__(self):
        return f"{self.user_id} {self.day}: {self.peak_bytes} B"
