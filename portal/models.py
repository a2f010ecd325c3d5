"""Catalog (GPU types, images) and instances as users rent them."""

from decimal import Decimal

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from portal import limits
from scheduler.models import Node, Workload, WorkloadGroup
from scheduler.registry import image_name


class GpuType(models.Model):
    """A card model for rent; ``name`` matches the model key nodes report."""

    name = models.CharField(max_length=64, unique=True, help_text="Model key as nodes report it, e.g. A100-80GB.")
    display_name = models.CharField(max_length=128)
    memory_gb = models.PositiveIntegerField()
    price_per_hour = models.DecimalField(max_digits=10, decimal_places=4, validators=[MinValueValidator(Decimal(0))])
    spot_price_per_hour = models.DecimalField(
        max_digits=10, decimal_places=4, validators=[MinValueValidator(Decimal(0))]
    )
    currency = models.CharField(max_length=3, default="CNY")
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ["price_per_hour"]
        constraints = [
            models.CheckConstraint(
                condition=Q(spot_price_per_hour__lte=models.F("price_per_hour")), name="spot_not_dearer"
            )
        ]

    def __str__(self):
        return self.display_name


class ImageVisibility(models.TextChoices):
    OFFICIAL = "official", _("Official")
    COMMUNITY = "community", _("Community")
    PRIVATE = "private", _("Private")


class ImageStatus(models.TextChoices):
    SAVING = "saving", _("Saving")
    BUILDING = "building", _("Building")  # a catalog image its hosts are still building (manage.py build_images)
    READY = "ready", _("Ready")
    FAILED = "failed", _("Failed")
    DELETING = "deleting", _("Deleting")
    DELETED = "deleted", _("Deleted")
    # A catalog image no longer offered: new work cannot use it; work already made from it keeps its row.
    RETIRED = "retired", _("Not offered")


class Image(models.Model):
    """A framework image of the catalog, or a user's instance saved as a private image (in the registry or a node)."""

    name = models.CharField(max_length=128)
    framework = models.CharField(max_length=64)
    framework_version = models.CharField(max_length=32)
    cuda_version = models.CharField(max_length=16)
    python_version = models.CharField(max_length=16, blank=True)
    docker_ref = models.CharField(max_length=255, help_text="Image reference on the nodes' Docker engine.")
    visibility = models.CharField(max_length=16, choices=ImageVisibility.choices, default=ImageVisibility.OFFICIAL)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE)
    # Saved images (portal/services/images.py): committed on the node that holds the instance's disk, then pushed to
    # the registry (node empty: any host) or, without one, used only on that node.
    status = models.CharField(max_length=16, choices=ImageStatus.choices, default=ImageStatus.READY)
    status_reason = models.CharField(max_length=255, blank=True)
    node = models.ForeignKey(
        Node,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Node holding it; empty: all.",
    )
    source_instance = models.ForeignKey(
        "Instance", null=True, blank=True, on_delete=models.SET_NULL, related_name="saved_images"
    )
    size_bytes = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    status_changed_at = models.DateTimeField(
        null=True, blank=True, help_text="When it began saving or deleting (the database's time): each has a deadline."
    )

    class Meta:
        ordering = ["framework", "-framework_version", "cuda_version"]
        constraints = [
            models.CheckConstraint(
                condition=~Q(visibility="private") | Q(owner__isnull=False), name="private_image_has_owner"
            )
        ]

    def __str__(self):
        return self.name

    @property
    def in_registry(self) -> bool:
        """Whether its reference names a registry (any host pulls it) rather than one engine's local image."""
        return bool(image_name(self.docker_ref).registry)


class BillingMode(models.TextChoices):
    ON_DEMAND = "on_demand", _("On-demand")
    SPOT = "spot", _("Spot (preemptible)")


class Instance(models.Model):
    """A rented container; its lifecycle is the scheduler workload it wraps."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="instances")
    name = models.CharField(max_length=64)
    image = models.ForeignKey(Image, on_delete=models.PROTECT)
    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT)
    gpus = models.DecimalField(max_digits=4, decimal_places=1, help_text="Whole cards, or a fraction 0.1 .. 0.9.")
    cpu_cores = models.PositiveIntegerField()
    memory_gb = models.PositiveIntegerField()
    disk_gb = models.PositiveIntegerField()
    disk_growing_to = models.PositiveIntegerField(
        null=True, blank=True, help_text="Its node is growing the data disk to this size (GB)."
    )
    disk_growing_since = models.DateTimeField(
        null=True, blank=True, help_text="When the growth was asked for (the database's time): it has a deadline."
    )
    billing_mode = models.CharField(max_length=16, choices=BillingMode.choices, default=BillingMode.ON_DEMAND)
    workload = models.OneToOneField(Workload, on_delete=models.PROTECT, related_name="instance")
    created_at = models.DateTimeField(auto_now_add=True)
    # Idle auto-stop (portal/services/housekeeping.py): stop when its GPUs stay below idle_util_percent
    # for idle_minutes.
    idle_util_percent = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Stop when GPU utilization stays below this (%); empty: never."
    )
    idle_minutes = models.PositiveIntegerField(
        default=limits.DEFAULT_IDLE_MINUTES, help_text="... for this many minutes."
    )
    stop_at = models.DateTimeField(null=True, blank=True, help_text="Stop at this time; empty: no scheduled stop.")
    stop_warned_at = models.DateTimeField(
        null=True, blank=True, help_text="When the console started warning that it will be stopped."
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return self.name

    @property
    def status(self) -> str:
        return self.workload.status


class ArrayStatus(models.TextChoices):
    RUNNING = "running", _("Running")  # some task is queued, starting, running or stopping
    DONE = "done", _("Done")  # every task succeeded
    FAILED = "failed", _("Failed")  # every task ended, some failed
    CANCELLED = "cancelled", _("Cancelled")  # by its owner
    STOPPED = "stopped", _("Stopped")  # by the platform: its budget was reached

    @classmethod
    def ended(cls):
        return [cls.DONE, cls.FAILED, cls.CANCELLED, cls.STOPPED]


class Fallback(models.TextChoices):
    NONE = "none", _("None: stay on spot")
    ON_DEMAND = "on-demand", _("On-demand")


class JobArray(models.Model):
    """Many jobs submitted as one (a sweep): Slurm-style indices or a parameter grid, one task (a Job) each.

    At most ``max_running`` tasks run at once (the scheduler's group cap); tasks run on spot
    by default and may fall back to on-demand; the array is stopped when its ``budget`` is reached.
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="job_arrays")
    name = models.CharField(max_length=64)
    spec = models.CharField(max_length=255, blank=True, help_text='Slurm indices as given ("0-31%4"); empty: a grid.')
    grid = models.JSONField(default=dict, blank=True, help_text="Parameter grid as given: name -> values.")
    total = models.PositiveIntegerField()
    max_running = models.PositiveIntegerField(null=True, blank=True)
    spot = models.BooleanField(default=True)
    fallback = models.CharField(max_length=16, choices=Fallback.choices, default=Fallback.NONE)
    max_preemptions = models.PositiveIntegerField(default=3)
    deadline = models.DateTimeField(null=True, blank=True)
    budget = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    currency = models.CharField(max_length=3, default="CNY")
    status = models.CharField(max_length=16, choices=ArrayStatus.choices, default=ArrayStatus.RUNNING)
    status_reason = models.CharField(max_length=255, blank=True)
    group = models.OneToOneField(WorkloadGroup, on_delete=models.PROTECT, related_name="array")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(budget__isnull=True) | Q(budget__gt=0), name="array_budget_positive"),
            models.CheckConstraint(
                condition=Q(max_running__isnull=True) | Q(max_running__gte=1), name="array_cap_at_least_one"
            ),
        ]

    def __str__(self):
        return self.name


class Job(models.Model):
    """A batch job: image + command + resources; runs to completion, may be preempted and resumed."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=64)
    image = models.ForeignKey(Image, on_delete=models.PROTECT)
    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT)
    gpus = models.DecimalField(max_digits=4, decimal_places=1)
    command = models.TextField(help_text="Run with sh -c in the image.")
    cpu_cores = models.PositiveIntegerField()
    memory_gb = models.PositiveIntegerField()
    workload = models.OneToOneField(Workload, on_delete=models.PROTECT, related_name="job")
    created_at = models.DateTimeField(auto_now_add=True)
    # A task of a job array: its index (Slurm's SLURM_ARRAY_TASK_ID) and its parameters.
    array = models.ForeignKey(JobArray, null=True, blank=True, on_delete=models.PROTECT, related_name="tasks")
    array_index = models.PositiveIntegerField(null=True, blank=True)
    params = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["array", "array_index"], name="one_task_per_array_index"),
            models.CheckConstraint(
                condition=Q(array__isnull=True, array_index__isnull=True)
                | Q(array__isnull=False, array_index__isnull=False),
                name="array_task_has_index",
            ),
        ]

    def __str__(self):
        return self.name


class IdempotencyKey(models.Model):
    """A create request's ``Idempotency-Key`` and the answer it got: a retry gets that same answer.

    The row is written in the transaction that creates the object, so either both
    exist or neither does (a crash in between leaves the key free for the retry).
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    endpoint = models.CharField(max_length=64)
    request_hash = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField(null=True)
    response = models.JSONField(null=True, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "key"], name="one_answer_per_idempotency_key")]

    def __str__(self):
        return f"{self.owner_id}: {self.key}"


class ApiToken(models.Model):
    """An API token: only the SHA-256 of its key is kept (the key is shown once, when it is made).

    The key is 256 random bits, so a plain digest is as good as a slow hash and lets
    every request find its token with one indexed lookup. A token ends at
    ``expires_at``, when revoked, and when its user's password changes.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=64)
    prefix = models.CharField(max_length=12, help_text="The key's first characters: enough to tell tokens apart.")
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["user", "expires_at"], name="apitoken_user_expiry")]

    def __str__(self):
        return f"{self.user_id}: {self.name} ({self.prefix}…)"


class AuditEntry(models.Model):
    """Someone used a power over work that is not theirs: an operator stopped it, support read its environment,
    a team's admin cancelled it; or over a team they do not run (staff changing its members or limits). Written by
    the service that did it, never changed or deleted (admin: read only)."""

    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Whose work it was; empty for a team's (``team``).",
    )
    team = models.CharField(max_length=64, blank=True, help_text="The team acted on (its slug), for a team's entry.")
    action = models.CharField(max_length=32)
    target = models.CharField(
        max_length=64, help_text="What it was done to: 'instance 12', 'job 7', 'array 3', 'member alice'."
    )
    created_at = models.DateTimeField(db_default=Now(), db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self):
        return f"{self.actor_id} {self.action} {self.target} of {self.owner_id or 'team ' + self.team}"
