"""Output shapes shared by several API views."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.models import GpuType, Image, Instance, Job
from portal.selectors.connect import services_of
from portal.selectors.rightsizing import instance_rightsizing
from portal.services.housekeeping import job_kept_until
from scheduler import sharedfs
from scheduler.policy import SHARE_FRACTIONS


class GpuTypeOutput(serializers.ModelSerializer):
    capacity = serializers.DictField(read_only=True)
    spot_price_now = serializers.DecimalField(
        source="spot_now",
        max_digits=12,
        decimal_places=4,
        allow_null=True,
        read_only=True,
        default=None,
        help_text="Spot price per card-hour now (it moves with the cluster's load); null until first computed.",
    )
    share_sizes = serializers.SerializerMethodField(
        help_text="The fractions of one card on offer (gpus below 1 is one of them): a card serves one share size at "
        "a time, set by the first fraction placed on it, so the sizes are few and each fills a card exactly."
    )

    class Meta:
        model = GpuType
        fields = [
            "id",
            "name",
            "display_name",
            "memory_gb",
            "price_per_hour",
            "spot_price_per_hour",
            "spot_price_now",
            "currency",
            "capacity",
            "share_sizes",
        ]

    @extend_schema_field(serializers.ListField(child=serializers.DecimalField(max_digits=4, decimal_places=3)))
    def get_share_sizes(self, gpu_type) -> list[str]:
        return [str(fraction) for fraction in SHARE_FRACTIONS]


class ImageOutput(serializers.ModelSerializer):
    class Meta:
        model = Image
        fields = [
            "id",
            "name",
            "framework",
            "framework_version",
            "cuda_version",
            "python_version",
            "docker_ref",
            "visibility",
            "status",
            "status_reason",
            "size_bytes",
            "node",
            "created_at",
        ]

    node = serializers.CharField(source="node.name", default=None, read_only=True)


class WorkloadFields(serializers.Serializer):
    """What instances and jobs share from their workload: lifecycle, node, and where queued work stands."""

    status = serializers.CharField(source="workload.status")
    status_reason = serializers.CharField(source="workload.status_reason")
    node = serializers.CharField(source="workload.node.name", default=None)
    simulated_gpu = serializers.BooleanField(source="workload.node.simulated", default=None)
    exit_code = serializers.IntegerField(source="workload.exit_code")
    started_at = serializers.DateTimeField(source="workload.started_at")
    queue_level = serializers.IntegerField(source="workload.queue_level")
    queue_position = serializers.IntegerField(source="workload.queue_position")
    preemptions = serializers.IntegerField(source="workload.preemptions")
    estimated_start_at = serializers.DateTimeField(source="workload.estimated_start_at")
    team = serializers.CharField(source="workload.team", help_text="The team charged; empty: the owner's wallet.")


class ServiceOutput(serializers.Serializer):
    name = serializers.CharField()
    port = serializers.IntegerField(help_text="Inside the instance.")
    host = serializers.CharField()
    host_port = serializers.IntegerField()
    address = serializers.CharField(help_text="A URL, or the ssh command.")


class InstanceOutput(WorkloadFields, serializers.ModelSerializer):
    container_id = serializers.CharField(source="workload.container_id")
    no_gpu = serializers.BooleanField(source="workload.no_gpu", help_text="Started without its cards (CPU only).")
    image = ImageOutput()
    gpu_type = serializers.CharField(source="gpu_type.name")

    class Meta:
        model = Instance
        fields = [
            "id",
            "name",
            "status",
            "status_reason",
            "image",
            "gpu_type",
            "gpus",
            "cpu_cores",
            "memory_gb",
            "disk_gb",
            "disk_growing_to",
            "billing_mode",
            "no_gpu",
            "node",
            "simulated_gpu",
            "container_id",
            "exit_code",
            "created_at",
            "started_at",
            "queue_level",
            "queue_position",
            "preemptions",
            "estimated_start_at",
            "team",
        ]


class RightsizingOutput(serializers.Serializer):
    gpus = serializers.DecimalField(max_digits=4, decimal_places=1, help_text="The share that would have held it.")
    holds = serializers.DecimalField(max_digits=4, decimal_places=1, help_text="What it holds.")
    peak_gpu = serializers.FloatField(help_text="Cards' worth of compute in its busiest minute.")
    peak_memory_mb = serializers.IntegerField(help_text="GPU memory in its fullest minute.")
    minutes = serializers.IntegerField(help_text="Minutes measured.")
    headroom_percent = serializers.IntegerField()
    since = serializers.DateTimeField(help_text="Measured since.")
    saving_this_month = serializers.DecimalField(max_digits=12, decimal_places=2)
    currency = serializers.CharField()


class InstanceDetailOutput(InstanceOutput):
    """One instance, with how to reach its published services (lists leave them out: a hot path)."""

    services = serializers.SerializerMethodField(
        help_text="Published services of a running instance: name, port inside, host, host_port, address."
    )
    rightsizing = serializers.SerializerMethodField(
        help_text="The smallest share that would have held its observed peak with headroom, and what it would have "
        "saved this month; null: not enough measured, or it needs what it holds."
    )

    class Meta(InstanceOutput.Meta):
        fields = [*InstanceOutput.Meta.fields, "services", "rightsizing"]

    @extend_schema_field(ServiceOutput(many=True))
    def get_services(self, instance) -> list:
        return services_of(instance.workload)

    @extend_schema_field(RightsizingOutput(allow_null=True))
    def get_rightsizing(self, instance) -> dict | None:
        suggestion = instance_rightsizing(instance)
        return None if suggestion is None else suggestion.as_dict()


class MemberOutput(serializers.Serializer):
    """One node's part of a job that spans nodes (a gang)."""

    rank = serializers.IntegerField()
    node = serializers.CharField(source="node_name")
    status = serializers.CharField()
    exit_code = serializers.IntegerField(allow_null=True)
    reason = serializers.CharField()


class JobOutput(WorkloadFields, serializers.ModelSerializer):
    priority = serializers.CharField(source="workload.get_priority_display")
    max_runtime_s = serializers.IntegerField(source="workload.max_runtime_s")
    finished_at = serializers.DateTimeField(source="workload.finished_at")
    log_tail = serializers.CharField(source="workload.log_tail")
    image = serializers.CharField(source="image.name")
    gpu_type = serializers.CharField(source="gpu_type.name")
    env = serializers.SerializerMethodField(
        help_text="Its environment: its owner's to read; null for anyone else (a holder of scheduler.view_work_env "
        "reads it with GET /jobs/<id>/?env=1, and the read is recorded)."
    )
    spot = serializers.BooleanField(source="workload.spot", help_text="On spot capacity now (at the spot price).")
    array = serializers.IntegerField(source="array_id", allow_null=True, help_text="The job array it is a task of.")
    nodes = serializers.IntegerField(
        source="workload.nodes", allow_null=True, help_text="Nodes asked for; empty: the scheduler chooses."
    )
    elastic_min = serializers.IntegerField(
        source="workload.elastic_min", allow_null=True, help_text="An elastic job's fewest cards; null: not elastic."
    )
    elastic_max = serializers.IntegerField(source="workload.elastic_max", allow_null=True)
    cards = serializers.IntegerField(
        source="workload.gpu_count",
        help_text="Cards it holds now, or asks for next (an elastic job's size changes as it is resized; gpus is "
        "what was asked).",
    )
    members = MemberOutput(
        source="workload.members.all",
        many=True,
        help_text="Over several nodes (a gang): each node's member, rank 0 first (its node is the job's node).",
    )
    auto_tmpdir = serializers.SerializerMethodField(
        help_text="Where it keeps its checkpoints (AUTO_TMPDIR, GPUCLOUD_CHECKPOINT_DIR): its folder on your file "
        "storage, which outlives the host it ran on and counts against your quota; without file storage, its own "
        "volume on its host."
    )
    kept_until = serializers.SerializerMethodField(
        help_text="When housekeeping releases the ended job with its checkpoints and volume; null while it queues or "
        "runs (or once released)."
    )

    @extend_schema_field(serializers.DictField(child=serializers.CharField(), allow_null=True))
    def get_env(self, job) -> dict | None:
        request = self.context.get("request")
        mine = request is not None and job.owner_id == request.user.pk
        return job.workload.env if mine or self.context.get("env_shown") else None

    def get_auto_tmpdir(self, job) -> str:
        return sharedfs.job_tmpdir(job.workload.uid)

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_kept_until(self, job) -> str | None:
        kept_until = job_kept_until(job)
        return None if kept_until is None else serializers.DateTimeField().to_representation(kept_until)

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "status",
            "status_reason",
            "command",
            "image",
            "gpu_type",
            "gpus",
            "cards",
            "elastic_min",
            "elastic_max",
            "nodes",
            "members",
            "cpu_cores",
            "memory_gb",
            "env",
            "spot",
            "array",
            "array_index",
            "params",
            "priority",
            "max_runtime_s",
            "node",
            "simulated_gpu",
            "exit_code",
            "created_at",
            "started_at",
            "finished_at",
            "queue_level",
            "queue_position",
            "preemptions",
            "estimated_start_at",
            "team",
            "auto_tmpdir",
            "kept_until",
            "log_tail",
        ]
