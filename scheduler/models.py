"""Cluster state: nodes and their cards, units of work, allocations, events.

Shares of a card are integer thousandths ("milli"): 1000 is a whole card.
The database itself refuses a card allocated beyond 1000 or beyond its memory,
and a node beyond its CPU and host memory, whatever code path writes them.
"""

import secrets

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from core.messages import node_queue
from scheduler.policy.cluster import WHOLE_CARD


def new_uid() -> str:
    """Names the work's container and volume; unique across databases sharing one Docker engine."""
    return secrets.token_hex(6)


class NodeStatus(models.TextChoices):
    ACTIVE = "active", _("Active")
    DRAINING = "draining", _("Draining")  # nothing new is placed; running work finishes or is stopped at the deadline
    DRAINED = "drained", _("Drained")  # nothing runs there any more
    LOST = "lost", _("Lost")
    REMOVED = "removed", _("Removed")  # taken out by an operator; its agent stops (a new start adds it again)


class Node(models.Model):
    """A GPU host, served by one node agent consuming queue ``node.<name>``."""

    name = models.SlugField(max_length=63, unique=True)
    hostname = models.CharField(max_length=255, blank=True)
    address = models.CharField(
        max_length=255, blank=True, help_text="Where the control plane and other hosts reach it (NODE_ADDRESS)."
    )
    relay_url = models.CharField(
        max_length=255, blank=True, help_text="The agent's relay service: terminal, files and logs of its containers."
    )
    relay_tls_sha256 = models.CharField(
        max_length=64,
        blank=True,
        help_text="SHA-256 of the certificate its relay serves over TLS (hex): what callers pin. Empty: plain HTTP.",
    )
    status = models.CharField(max_length=16, choices=NodeStatus.choices, default=NodeStatus.ACTIVE)
    simulated = models.BooleanField(default=False, help_text="GPUs are simulated (no NVML on this host).")
    nvidia_runtime = models.BooleanField(default=False)
    cpu_cores = models.PositiveIntegerField()
    memory_mb = models.PositiveIntegerField()
    allocated_cpu = models.PositiveIntegerField(default=0)
    allocated_memory_mb = models.PositiveIntegerField(default=0)
    docker_version = models.CharField(max_length=64, blank=True)
    registered_at = models.DateTimeField(auto_now_add=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    epoch = models.PositiveIntegerField(
        default=0, help_text="Bumped at each agent start; heartbeats of an older agent are refused."
    )
    drain_deadline = models.DateTimeField(
        null=True, blank=True, help_text="While draining: work still running then is stopped (jobs are requeued)."
    )
    disk_gb = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="GB its tenants' disks (each a data disk and a system disk) may reserve, as registered; placement "
        "never reserves more (scheduler.selectors.disk_held). Empty: not counted.",
    )
    disk_total_gb = models.PositiveIntegerField(
        null=True, blank=True, help_text="Size of the disk holding its containers and data disks (agent's report)."
    )
    disk_free_gb = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Free on that disk at the last heartbeat; below NODE_DISK_MIN_FREE_GB "
        "the scheduler places nothing new here.",
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(allocated_cpu__lte=F("cpu_cores")), name="node_cpu_not_overcommitted"),
            models.CheckConstraint(
                condition=Q(allocated_memory_mb__lte=F("memory_mb")), name="node_memory_not_overcommitted"
            ),
        ]

    def __str__(self):
        return self.name

    @property
    def queue(self) -> str:
        return node_queue(self.name)

    @property
    def slow_queue(self) -> str:
        return node_queue(self.name, slow=True)


class ClusterWatch(models.Model):
    """When the control plane last looked at the nodes' heartbeats, and since when without a gap.

    A node is lost only once the control plane has WATCHED it stay silent for
    ``NODE_LOST_AFTER_S``: after its own outage (database, Redis, worker or beat
    down) it starts watching afresh, so that outage never makes every node lost.
    One row.
    """

    checked_at = models.DateTimeField()
    watching_since = models.DateTimeField()

    def __str__(self):
        return f"watching since {self.watching_since:%Y-%m-%d %H:%M:%S}"


class Gpu(models.Model):
    """One card on a node."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64, unique=True)
    model = models.CharField(max_length=64, db_index=True, help_text="Matches a catalog GPU type name.")
    memory_mb = models.PositiveIntegerField()
    allocated_milli = models.PositiveIntegerField(default=0)
    allocated_memory_mb = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_per_node"),
            models.CheckConstraint(condition=Q(allocated_milli__lte=WHOLE_CARD), name="gpu_share_at_most_one_card"),
            models.CheckConstraint(
                condition=Q(allocated_memory_mb__lte=F("memory_mb")), name="gpu_memory_not_overcommitted"
            ),
        ]

    def __str__(self):
        return f"{self.node.name}/gpu{self.index} ({self.model})"


class WorkloadStatus(models.TextChoices):
    QUEUED = "queued", _("Queued")
    STARTING = "starting", _("Starting")
    RUNNING = "running", _("Running")
    STOPPING = "stopping", _("Stopping")
    STOPPED = "stopped", _("Stopped")
    RELEASING = "releasing", _("Releasing")
    RELEASED = "released", _("Released")
    FAILED = "failed", _("Failed")
    SUCCEEDED = "succeeded", _("Succeeded")
    MOVING = "moving", _("Moving")  # a stopped instance's disks being copied to another host (``Move``)

    @classmethod
    def holding_resources(cls):
        """States in which the work holds allocations on a node."""
        return [cls.STARTING, cls.RUNNING, cls.STOPPING]

    @classmethod
    def transitional(cls):
        """States a node-agent task is expected to move on; each has a deadline (TRANSITION_DEADLINE_S)."""
        return [cls.STARTING, cls.STOPPING, cls.RELEASING]

    @classmethod
    def terminal(cls):
        return [cls.RELEASED]

    @classmethod
    def ended_job(cls):
        """States of a job that ended and is not released yet: its disk (its files) is still on its host."""
        return [cls.SUCCEEDED, cls.FAILED, cls.STOPPED]


class Priority(models.IntegerChoices):
    HIGH = 0, _("High")
    NORMAL = 1, _("Normal")
    LOW = 2, _("Low")


class WorkloadKind(models.TextChoices):
    INSTANCE = "instance", _("Interactive instance")
    JOB = "job", _("Batch job")


# A job that ended and is not released: its data disk stays on its host (``WorkloadStatus.ended_job``). The
# PostgreSQL trigger that keeps ``DiskDelta`` spells the same condition out (migration 0030): change both.
ENDED_JOB = Q(kind=WorkloadKind.JOB, status__in=WorkloadStatus.ended_job())


class WorkloadGroup(models.Model):
    """Work submitted together (a job array): at most ``max_running`` of its members run at once.

    The cap is the scheduler's (the policy honours it, live and in the simulator); what the
    group means to users — tasks, parameters, budget — belongs to whoever made it.
    """

    name = models.CharField(max_length=128, help_text="Shown on bills, e.g. 'array 12: sweep'.")
    max_running = models.PositiveIntegerField(
        null=True, blank=True, help_text="Most members running (or starting, or stopping) at once; empty: no cap."
    )
    # Spot members waiting in the queue run on-demand from then on (the policy's ``falls_back``):
    spot_fallback_after = models.PositiveIntegerField(
        null=True, blank=True, help_text="... once preempted more than this many times; empty: never."
    )
    spot_fallback_at = models.DateTimeField(null=True, blank=True, help_text="... from this time on; empty: never.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(max_running__isnull=True) | Q(max_running__gte=1), name="group_cap_at_least_one"
            )
        ]

    def __str__(self):
        return self.name


def card_share(gpu_count: int, gpu_milli: int, *, no_gpu: bool = False) -> float:
    """Cards held, in whole cards (2 x 0.5 = 1.0); none for work started without cards. For the model
    (``Workload.gpu_share``) and for the tick's rows of it alike."""
    return 0.0 if no_gpu else gpu_count * gpu_milli / WHOLE_CARD


class Workload(models.Model):
    """A unit of work the scheduler queues, places and runs as one container."""

    uid = models.CharField(max_length=16, unique=True, default=new_uid, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="workloads")
    kind = models.CharField(max_length=16, choices=WorkloadKind.choices)
    name = models.CharField(max_length=128)
    image_ref = models.CharField(max_length=255)
    gpu_model = models.CharField(max_length=64)
    gpu_count = models.PositiveSmallIntegerField(help_text="Cards; 1 when a fraction is asked for.")
    gpu_milli = models.PositiveIntegerField(help_text="Share of each card in thousandths (1000 = whole card).")
    cpu_cores = models.PositiveIntegerField()
    memory_mb = models.PositiveIntegerField()
    disk_gb = models.PositiveIntegerField()
    preemptible = models.BooleanField(default=False, help_text="Batch jobs and spot instances.")
    spot = models.BooleanField(default=False, help_text="Spot capacity: any on-demand work may evict it.")
    team = models.CharField(max_length=64, blank=True)
    group = models.ForeignKey(WorkloadGroup, null=True, blank=True, on_delete=models.PROTECT, related_name="workloads")
    priority = models.PositiveSmallIntegerField(choices=Priority.choices, default=Priority.NORMAL)
    max_runtime_s = models.PositiveIntegerField(null=True, blank=True)
    nodes = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        help_text="Nodes a gang asks for (gpu_count / nodes cards on each); empty: the scheduler chooses "
        "(one node if it fits on one, else the fewest).",
    )
    master_port = models.PositiveIntegerField(
        null=True, blank=True, help_text="A gang's rendezvous port, published on rank 0's host (MASTER_PORT)."
    )
    # Elastic jobs run on elastic_min..elastic_max cards; gpu_count is the size they hold now, or ask next
    # (the size a resize decided, or the size asked at submission). Each resize is a restart from checkpoint.
    elastic_min = models.PositiveSmallIntegerField(null=True, blank=True, help_text="Fewest cards (elastic jobs).")
    elastic_max = models.PositiveSmallIntegerField(null=True, blank=True, help_text="Most cards (elastic jobs).")
    # Scheduler state: MLFQ service and queue, shown to the user while waiting.
    attained_service = models.FloatField(default=0.0, help_text="Weighted GPU-seconds of service so far.")
    accrued_at = models.DateTimeField(null=True, blank=True)
    queue_level = models.PositiveSmallIntegerField(default=0)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    estimated_start_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When queued work may start, from running jobs' maximum runtimes; null: unknown.",
    )
    gpu_utilization = models.FloatField(null=True, blank=True, help_text="Recent mean GPU utilization, 0..1.")
    no_gpu = models.BooleanField(
        default=False, help_text="Running without its cards (CPU only, at the no-GPU price), as started last."
    )
    preempt_requested = models.BooleanField(default=False)
    # A restart claims running work before its node stops the container, so that exit is not read as the
    # work's end (agent.reconcile); ``restarts`` counts the claims, so a reconcile that read the
    # container before a restart began and ended acts on nothing.
    restarting = models.BooleanField(default=False, help_text="Its node is restarting the container.")
    restarts = models.PositiveIntegerField(default=0, help_text="Restarts asked for so far.")
    preemptions = models.PositiveIntegerField(default=0)
    log_tail = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=WorkloadStatus.choices, default=WorkloadStatus.QUEUED)
    status_reason = models.CharField(max_length=255, blank=True)
    status_changed_at = models.DateTimeField(
        null=True, blank=True, help_text="When the status last changed: transitional states have a deadline from it."
    )
    pinned_node = models.ForeignKey(
        Node,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Node the work must return to (its container disk lives there).",
    )
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="workloads")
    container_id = models.CharField(max_length=80, blank=True)
    ports = models.JSONField(
        default=dict, blank=True, help_text="Published service ports of its last launch: container port -> host port."
    )
    exit_code = models.IntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    resized_at = models.DateTimeField(
        null=True, blank=True, help_text="An elastic gang's last change of members while it ran (services.elastic)."
    )
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        # Who may queue work ahead of everyone else's: superusers, and users or groups an administrator gives it.
        # Staff powers over other people's work are permissions too (being staff gives none: the "Support" and
        # "Operators" groups hold them; portal.selectors reads them; portal.models.AuditEntry records their use).
        permissions = [
            ("submit_high_priority", "Can submit work at high priority"),
            ("view_any_work", "Can see every user's instances, jobs and arrays"),
            ("operate_any_work", "Can stop, start, restart, release, move, grow or save anyone's work"),
            ("view_work_env", "Can read the environment of anyone's job"),
        ]
        indexes = [models.Index(fields=["status", "queued_at"])]
        constraints = [
            models.CheckConstraint(
                condition=Q(gpu_milli__gte=1, gpu_milli__lte=WHOLE_CARD), name="workload_share_range"
            ),
            models.CheckConstraint(
                condition=Q(gpu_milli=WHOLE_CARD) | Q(gpu_count=1), name="workload_fraction_is_single_card"
            ),
            models.CheckConstraint(condition=Q(gpu_count__gte=1), name="workload_at_least_one_card"),
            models.CheckConstraint(
                condition=Q(nodes__isnull=True) | Q(nodes__gte=1, nodes__lte=F("gpu_count")),
                name="workload_nodes_at_most_its_cards",
            ),
            models.CheckConstraint(
                condition=Q(elastic_min__isnull=True, elastic_max__isnull=True)
                | Q(elastic_min__gte=1, elastic_min__lte=F("gpu_count"), elastic_max__gte=F("gpu_count")),
                name="workload_elastic_size_within_its_range",
            ),
        ]

    def __str__(self):
        return f"{self.kind} {self.name} ({self.status})"

    @property
    def command(self) -> list:
        """What it runs (``WorkloadSpec``; none for work made without one: the image's own)."""
        spec = self._spec()
        return spec.command if spec is not None else []

    @property
    def env(self) -> dict:
        """Its environment (``WorkloadSpec``): read only by its owner, its own host, and whoever may (portal)."""
        spec = self._spec()
        return spec.env if spec is not None else {}

    def _spec(self):
        try:
            return self.spec
        except WorkloadSpec.DoesNotExist:
            return None

    @property
    def disk_node(self):
        """The node holding its disk: where it runs or last ran (``node``), or where it must return (``pinned_node``);
        None when it has no disk on any node."""
        return self.node or self.pinned_node

    @property
    def gpu_share(self) -> float:
        return card_share(self.gpu_count, self.gpu_milli, no_gpu=self.no_gpu)

    @property
    def held_cpu_cores(self) -> int:
        """CPU cores it holds on its node: as asked, or at most NO_GPU_CPU_CORES when started without cards."""
        return min(self.cpu_cores, settings.NO_GPU_CPU_CORES) if self.no_gpu else self.cpu_cores

    @property
    def held_memory_mb(self) -> int:
        return min(self.memory_mb, settings.NO_GPU_MEMORY_MB) if self.no_gpu else self.memory_mb

    @property
    def is_gang(self) -> bool:
        """Whether its placement (the current one, or the last before it was queued again) spans several nodes.

        Each placement writes the rendezvous port and the members together (``allocation.py``): a port for
        a gang, none for single-node work. So the row itself says which it is, and a single-node launch or
        stop never asks the members' table."""
        return self.master_port is not None

    @property
    def volume_name(self) -> str:
        return f"gpucloud-data-{self.uid}"

    @property
    def container_name(self) -> str:
        return f"gpucloud-{self.kind}-{self.uid}"


class DiskDelta(models.Model):
    """What tenants' disks add to a node (``gb`` and ``containers`` > 0) or give back, as one workload's row changed.

    Written on PostgreSQL only, by a trigger on the workload table (migration 0030), in the same transaction as the
    workload's row: each workload counts where ``selectors.disk_held`` says (its data disk, and one container's
    system disk while it is not an ended job), and a change of its status, kind, node, node to return to or disk
    that moves what it counts writes the difference. ``disk_held`` sums the rows by node instead of every workload
    (a tick's placements and departures: ~20 ms a tick of two sums over 5,000 rows), and
    ``services.cluster.disk_delta_fold`` folds them into one row per node now and then. The system disk's size is
    a setting, so the rows count containers, not their GB. On other databases (SQLite, ``make run``) the table
    stays empty and the workloads are summed."""

    node_id = models.BigIntegerField(help_text="The node's id (no foreign key: a node may be deleted).")
    gb = models.BigIntegerField(help_text="Data disks' GB.")
    containers = models.BigIntegerField(help_text="Containers, each reserving INSTANCE_SYSTEM_DISK_GB.")

    def __str__(self):
        return f"node {self.node_id}: {self.gb:+d} GB, {self.containers:+d} containers"


class Allocation(models.Model):
    """A share of one card held by one workload while it is placed."""

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="allocations")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="allocations")
    milli = models.PositiveIntegerField()
    memory_mb = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workload", "gpu"], name="allocation_once_per_card"),
            models.CheckConstraint(condition=Q(milli__gte=1, milli__lte=WHOLE_CARD), name="allocation_share_range"),
        ]

    def __str__(self):
        return f"{self.workload_id} on {self.gpu} ({self.milli}/{WHOLE_CARD})"


class MemberStatus(models.TextChoices):
    STARTING = "starting", _("Starting")
    RUNNING = "running", _("Running")
    EXITED = "exited", _("Exited")  # its container ended by itself (exit_code)
    STOPPED = "stopped", _("Stopped")  # stopped by the platform (the gang stops as one), or its host was lost
    # An elastic gang's member told to leave while the gang runs on (its container has the grace to checkpoint),
    # then gone: its cards given back, the gang not stopped (``services.elastic``).
    LEAVING = "leaving", _("Leaving")
    LEFT = "left", _("Left")

    @classmethod
    def live(cls) -> list[str]:
        """Members whose container may be running: started or starting, or leaving through its grace."""
        return [cls.STARTING, cls.RUNNING, cls.LEAVING]


class WorkloadMember(models.Model):
    """One node's part of a gang (work placed on several nodes): its rank, its host and its container.

    The gang is one ``Workload`` (one row for its owner, one bill with all its cards; its
    allocations name cards on every member's node; ``Workload.node`` is rank 0's). Each
    member's node agent runs one container for it. The rows of a placement are written with
    its allocations and replaced by the next placement; single-node work has none.
    """

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="members")
    rank = models.PositiveSmallIntegerField()
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    node_name = models.CharField(max_length=63)
    status = models.CharField(max_length=16, choices=MemberStatus.choices, default=MemberStatus.STARTING)
    container_id = models.CharField(max_length=80, blank=True)
    address = models.CharField(
        max_length=64, blank=True, help_text="Its container's address on its host's tenants' network (the fence)."
    )
    exit_code = models.IntegerField(null=True, blank=True)
    reason = models.CharField(max_length=255, blank=True)
    changed_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["workload", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["workload", "rank"], name="member_unique_rank"),
            models.UniqueConstraint(fields=["workload", "node"], name="member_one_per_node"),
        ]

    def __str__(self):
        return f"{self.workload_id} rank {self.rank} on {self.node_name} ({self.status})"

    @property
    def container_name(self) -> str:
        """Rank 0 keeps the work's own name (logs, terminal); the others are told apart by rank."""
        return self.workload.container_name if self.rank == 0 else f"{self.workload.container_name}-r{self.rank}"


class MeterChange(models.TextChoices):
    """A running workload's meter stopped or started again without a change of status (its host lost, then back),
    or its cards changed while it runs (an elastic gang's member joined or left: a new segment at the new size)."""

    PAUSE = "pause", _("Not charged from here")
    RESUME = "resume", _("Charged again from here")
    RESIZE = "resize", _("Charged for its new cards from here")


class WorkloadEvent(models.Model):
    """One status change of a workload (append-only); or, from and to the same status, a note, which may pause or
    resume its meter (``meter``: billing's segments follow the events, billing.metering.running_intervals)."""

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="events")
    from_status = models.CharField(max_length=16, choices=WorkloadStatus.choices, blank=True)
    to_status = models.CharField(max_length=16, choices=WorkloadStatus.choices)
    reason = models.CharField(max_length=255, blank=True)
    meter = models.CharField(max_length=8, choices=MeterChange.choices, blank=True, default="", db_default="")
    # The database's clock, whichever machine records the change (core.clock).
    created_at = models.DateTimeField(db_default=Now(), db_index=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self):
        return f"{self.workload_id}: {self.from_status} -> {self.to_status}"


class WorkloadRun(models.Model):
    """One start of a workload's container, on one node: where that piece of its log lives.

    Numbered from 1 in start order; a log cursor begins with the run's number, so the pieces of a
    preempted-and-resumed job read as one log across hosts. ``node_name`` stays when the node is removed.
    A gang's every member opens a run on its own host, with its ``rank`` (rank 0's first).
    """

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="runs")
    number = models.PositiveIntegerField()
    rank = models.PositiveSmallIntegerField(
        default=0, db_default=0, help_text="The gang member's rank (0: single-node work)."
    )
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    node_name = models.CharField(max_length=63)
    started_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["workload", "number"]
        constraints = [
            models.UniqueConstraint(fields=["workload", "number"], name="workload_run_unique_number"),
            models.CheckConstraint(condition=Q(number__gte=1), name="workload_run_number_from_one"),
        ]

    def __str__(self):
        return f"{self.workload_id} run {self.number} on {self.node_name}"


class WorkloadSpec(models.Model):
    """What a workload runs and with which environment (API keys live there): a table of its own, so a GPU host's
    database role reads only its own work's (``db_roles``: every host reads the workloads' other columns)."""

    workload = models.OneToOneField(Workload, on_delete=models.CASCADE, primary_key=True, related_name="spec")
    command = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)

    def __str__(self):
        return f"spec of {self.workload_id}"


class WorkloadCode(models.Model):
    """A job's code as its owner sent it (a .tar.gz), extracted into its data disk by its node's agent each time
    the container is created, before the command runs there (``agent/launcher.py``)."""

    workload = models.OneToOneField(Workload, on_delete=models.CASCADE, primary_key=True, related_name="code")
    archive = models.BinaryField()
    size_bytes = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(db_default=Now())

    def __str__(self):
        return f"code of {self.workload_id} ({self.size_bytes} bytes)"


class MoveStatus(models.TextChoices):
    COPYING = "copying", _("Copying")
    DONE = "done", _("Done")
    FAILED = "failed", _("Failed")


class Move(models.Model):
    """A stopped instance's disks copied from its host to another (``scheduler.services.moves``).

    The system disk travels as an image through the registry; the data disk as a tar
    stream from the source agent's relay to the target agent, checksummed on both
    ends. The source's copy is removed only once both checksums agree.
    """

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="moves")
    source = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="+")
    target = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="+")
    status = models.CharField(max_length=16, choices=MoveStatus.choices, default=MoveStatus.COPYING)
    phase = models.CharField(max_length=64, blank=True, help_text="What is being copied now.")
    snapshot_ref = models.CharField(max_length=255, blank=True, help_text="The system disk, in the registry.")
    bytes_total = models.BigIntegerField(null=True, blank=True)
    bytes_done = models.BigIntegerField(default=0)
    sent_sha256 = models.CharField(max_length=64, blank=True)
    received_sha256 = models.CharField(max_length=64, blank=True)
    error = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["workload"], condition=Q(status="copying"), name="one_move_at_a_time_per_workload"
            ),
            models.CheckConstraint(condition=~Q(source=F("target")), name="move_to_another_node"),
        ]

    def __str__(self):
        return f"move of {self.workload_id}: {self.source_id} -> {self.target_id} ({self.status})"


class Quota(models.Model):
    """Most cards a user, or a team, may hold at once (queued work waits beyond it)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE)
    team = models.CharField(max_length=64, blank=True)
    max_cards = models.DecimalField(max_digits=6, decimal_places=1)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(Q(user__isnull=False) & Q(team="")) | (Q(user__isnull=True) & ~Q(team="")),
                name="quota_for_a_user_or_a_team",
            ),
            models.UniqueConstraint(fields=["team"], condition=~Q(team=""), name="one_quota_per_team"),
            models.CheckConstraint(condition=Q(max_cards__gte=0), name="quota_not_negative"),
        ]

    def __str__(self):
        return f"{self.user or 'team ' + self.team}: {self.max_cards} cards"


class MinuteRollup(models.Model):
    """One minute of GPU samples folded: what long charts, idle detection and billing read."""

    minute = models.DateTimeField(help_text="Start of the minute (UTC).")
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="+")
    samples = models.PositiveSmallIntegerField()
    util_avg = models.FloatField(null=True, blank=True, help_text="0..1")
    util_max = models.FloatField(null=True, blank=True)
    mem_max_mb = models.PositiveIntegerField(null=True, blank=True)
    power_avg_w = models.FloatField(null=True, blank=True, help_text="The card's.")

    # What a minute's row carries besides its keys: what the host writes (and may rewrite) of it.
    VALUES = ("samples", "util_avg", "util_max", "mem_max_mb", "power_avg_w")

    class Meta:
        abstract = True

    def __str__(self):
        return f"{self.gpu_id} @ {self.minute:%Y-%m-%d %H:%M}: {self.util_avg}"


class GpuMinute(MinuteRollup):
    """A whole card's minute."""

    class Meta:
        constraints = [models.UniqueConstraint(fields=["gpu", "minute"], name="gpu_minute_once")]
        indexes = [models.Index(fields=["minute"])]


class WorkloadGpuMinute(MinuteRollup):
    """A workload's minute on one card: utilization of its share, its own memory."""

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="gpu_minutes")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workload", "gpu", "minute"], name="workload_gpu_minute_once")]
        indexes = [models.Index(fields=["minute"])]


class RegistryCredential(models.Model):
    """A GPU host's own registry login (``manage.py registry_host_user``): the SHA-256 of its password.

    The token server (``portal.services.registry_tokens``) checks it. Hosts' database roles are granted nothing
    of this table (``db_roles``): a host reads no other host's login. Keyed by the host's name, so that it may be
    made before the host first registers."""

    host = models.CharField(max_length=63, unique=True)
    password_sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"registry login of {self.host}"
