"""REST API: one view per operation, nested input serializers, services do the work."""

import json
from decimal import Decimal

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import IsAdminUser
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import storage
from core.errors import InvalidInput, NotFound
from portal import limits, selectors
from portal.api.idempotency import HEADER, idempotent
from portal.api.pagination import page_of, paginated, paginated_rows
from portal.api.rows import Rows
from portal.api.serializers import GpuTypeOutput, ImageOutput, InstanceDetailOutput, InstanceOutput, JobOutput
from portal.models import BillingMode
from portal.services import images, work
from portal.services.recommend import BYTES, recommend
from portal.services.requests import InstanceRequest, JobRequest, WorkRequest
from portal.throttles import CreateRateThrottle
from scheduler import selectors as cluster

IDEMPOTENCY_KEY = OpenApiParameter(
    HEADER,
    str,
    OpenApiParameter.HEADER,
    description="A key of yours (e.g. a UUID): a retried request with the same key creates nothing new "
    "and gets the first answer again.",
)


class ModelSizeInput(serializers.Serializer):
    model_params_b = serializers.FloatField(min_value=0.001, max_value=10_000)
    precision = serializers.ChoiceField(choices=list(BYTES), default="bf16")
    task = serializers.ChoiceField(choices=["train", "inference"], default="train")


def _gpu_choice(data: dict) -> dict:
    """Turn gpu_type="recommend" (with the model's size) into a concrete type and card count."""
    fields = dict(data)
    size = {k: fields.pop(k) for k in ("model_params_b", "precision", "task") if k in fields}
    if fields["gpu_type"] != "recommend":
        try:
            fields["gpu_type_id"] = int(fields.pop("gpu_type"))
        except ValueError:
            raise InvalidInput('must be a GPU type id or "recommend"', field="gpu_type") from None
        if fields.get("gpus") is None:
            raise InvalidInput("this field is required", field="gpus")
        return fields
    if "model_params_b" not in size:
        raise InvalidInput('needed when gpu_type is "recommend" (billions of parameters)', field="model_params_b")
    choice = recommend(
        gpu_types=selectors.gpu_type_list(),
        params_billion=size["model_params_b"],
        precision=size.get("precision", "bf16"),
        task=size.get("task", "train"),
    )
    fields.pop("gpu_type")
    fields["gpu_type_id"], fields["gpus"] = choice.gpu_type.pk, Decimal(choice.cards)
    return fields


class WorkInput(serializers.Serializer):
    """What instances and jobs ask for alike: an image, a GPU choice, CPU and memory."""

    image = serializers.IntegerField()
    gpu_type = serializers.CharField(help_text='A GPU type id, or "recommend" with model_params_b.')
    gpus = serializers.DecimalField(max_digits=4, decimal_places=2, required=False)
    model_params_b = serializers.FloatField(min_value=0.001, max_value=10_000, required=False)
    precision = serializers.ChoiceField(choices=list(BYTES), required=False)
    task = serializers.ChoiceField(choices=["train", "inference"], required=False)
    cpu_cores = serializers.IntegerField(
        min_value=limits.CPU_CORES.min, max_value=limits.CPU_CORES.max, default=limits.DEFAULT_CPU_CORES
    )
    memory_gb = serializers.IntegerField(
        min_value=limits.MEMORY_GB.min, max_value=limits.MEMORY_GB.max, default=limits.DEFAULT_MEMORY_GB
    )
    team = serializers.CharField(
        max_length=64,
        required=False,
        default="",
        help_text="A team's slug: charge the team's wallet (you are a member).",
    )

    request_class: type[WorkRequest] = WorkRequest  # what the subclass asks for

    def work_request(self, owner) -> WorkRequest:
        """Validated data as the services' request, with a "recommend" GPU choice resolved."""
        return self.request_class.of(owner, _gpu_choice(self.validated_data))


class GpuTypeRecommendApi(APIView):
    """GET /gpu-types/recommend/?model_params_b=7&precision=bf16&task=train"""

    class RecommendationOutput(serializers.Serializer):
        gpu_type = GpuTypeOutput()
        cards = serializers.IntegerField()
        memory_gb = serializers.FloatField()
        price_per_hour = serializers.DecimalField(max_digits=12, decimal_places=4)
        reason = serializers.CharField()

    @extend_schema(parameters=[ModelSizeInput], responses=RecommendationOutput)
    def get(self, request):
        size = ModelSizeInput(data=request.query_params)
        size.is_valid(raise_exception=True)
        choice = recommend(
            gpu_types=selectors.gpu_type_list(),
            params_billion=size.validated_data["model_params_b"],
            precision=size.validated_data["precision"],
            task=size.validated_data["task"],
        )
        return Response(self.RecommendationOutput(choice).data)


class SharedStorageOutput(serializers.Serializer):
    path = serializers.CharField(help_text="Where each of your instances and jobs mounts it, on every host.")
    used_bytes = serializers.IntegerField(help_text="As last measured (every 15 minutes by default).")
    quota_bytes = serializers.IntegerField(help_text="A write past it fails (EDQUOT, 'Disk quota exceeded').")
    measured_at = serializers.DateTimeField(allow_null=True)


class MeApi(APIView):
    """GET /me/: who the credentials belong to (check a token), and their shared file storage."""

    class MeOutput(serializers.Serializer):
        username = serializers.CharField()
        is_staff = serializers.BooleanField()
        shared_storage = SharedStorageOutput(allow_null=True, help_text="null while the platform has none.")
        websocket_url = serializers.CharField(
            allow_blank=True,
            help_text="Where the WebSockets (logs, terminals) are served; empty: this same address (ws:// or wss://).",
        )

    @extend_schema(responses=MeOutput)
    def get(self, request):
        user = request.user
        shared = storage.shared_storage_of(user)
        me = {"username": user.username, "is_staff": user.is_staff, "shared_storage": shared}
        return Response(self.MeOutput(me | {"websocket_url": settings.WEBSOCKET_URL}).data)


class GpuTypeListApi(APIView):
    @extend_schema(responses=page_of(GpuTypeOutput))
    def get(self, request):
        return paginated(self, selectors.gpu_type_list(), GpuTypeOutput)


class ImageListApi(APIView):
    """GET: images to create work from (the catalog's and your ready saved ones); ``?mine=1``: your saved
    images in every state (saving, ready, failed, deleting)."""

    @extend_schema(
        parameters=[OpenApiParameter("mine", bool, description="Only your saved images, in every state.")],
        responses=page_of(ImageOutput),
    )
    def get(self, request):
        if request.query_params.get("mine") in ("1", "true"):
            return paginated(self, images.saved_image_list(user=request.user), ImageOutput)
        return paginated(self, selectors.image_list(user=request.user).select_related("node"), ImageOutput)


class ImageDetailApi(APIView):
    """GET one of your saved images; DELETE removes it from its node (202: deleting)."""

    @staticmethod
    def _get(request, image_id: int):
        image = images.saved_image_list(user=request.user).filter(pk=image_id).first()
        if image is None:
            raise NotFound("no such image of yours")
        return image

    @extend_schema(responses=ImageOutput)
    def get(self, request, image_id: int):
        return Response(ImageOutput(self._get(request, image_id)).data)

    @extend_schema(responses={202: ImageOutput})
    def delete(self, request, image_id: int):
        image = images.image_delete(image=self._get(request, image_id))
        return Response(ImageOutput(image).data, status=status.HTTP_202_ACCEPTED)


class InstanceDiskApi(APIView):
    """POST /instances/<id>/disk/ {"disk_gb"}: grow the data disk (online; 202 while its node grows it)."""

    class DiskInput(serializers.Serializer):
        disk_gb = serializers.IntegerField(min_value=limits.DISK_GB.min, max_value=limits.DISK_GB.max)

    @extend_schema(request=DiskInput, responses={202: InstanceOutput})
    def post(self, request, instance_id: int):
        instance = selectors.instance_get(user=request.user, instance_id=instance_id, action="grow-disk")
        data = self.DiskInput(data=request.data)
        data.is_valid(raise_exception=True)
        instance = work.instance_grow_disk(instance=instance, disk_gb=data.validated_data["disk_gb"], by=request.user)
        return Response(InstanceOutput(instance).data, status=status.HTTP_202_ACCEPTED)


class InstanceSaveImageApi(APIView):
    """POST /instances/<id>/save-image/ {"name"}: commit the stopped instance's system disk (202: saving)."""

    throttle_classes = [*APIView.throttle_classes, CreateRateThrottle]

    class SaveImageInput(serializers.Serializer):
        name = serializers.CharField(max_length=limits.NAME_CHARS)

    @extend_schema(request=SaveImageInput, responses={202: ImageOutput})
    def post(self, request, instance_id: int):
        instance = selectors.instance_get(user=request.user, instance_id=instance_id, action="save-image")
        data = self.SaveImageInput(data=request.data)
        data.is_valid(raise_exception=True)
        image = images.image_save(instance=instance, name=data.validated_data["name"], by=request.user)
        return Response(ImageOutput(image).data, status=status.HTTP_202_ACCEPTED)


class InstanceListApi(APIView):
    throttle_classes = [*APIView.throttle_classes, CreateRateThrottle]

    class InstanceCreateInput(WorkInput):
        request_class = InstanceRequest
        name = serializers.CharField(max_length=limits.NAME_CHARS, default="instance")
        disk_gb = serializers.IntegerField(min_value=limits.DISK_GB.min, max_value=limits.DISK_GB.max, default=50)
        billing_mode = serializers.ChoiceField(choices=BillingMode.choices, default=BillingMode.ON_DEMAND)
        idle_util_percent = serializers.IntegerField(
            min_value=1,
            max_value=100,
            required=False,
            allow_null=True,
            default=None,
            help_text="Stop the instance when its GPU utilization stays below this (%) ...",
        )
        idle_minutes = serializers.IntegerField(
            min_value=limits.IDLE_MINUTES.min,
            max_value=limits.IDLE_MINUTES.max,
            default=limits.DEFAULT_IDLE_MINUTES,
            help_text="... this long.",
        )
        stop_at = serializers.DateTimeField(
            required=False, allow_null=True, default=None, help_text="Stop at this time."
        )

    rows = Rows(InstanceOutput)

    @extend_schema(responses=page_of(InstanceOutput))
    def get(self, request):
        return paginated_rows(self, self.rows, selectors.instances_of, owner=selectors.seen_by(request.user))

    @extend_schema(request=InstanceCreateInput, responses={201: InstanceOutput}, parameters=[IDEMPOTENCY_KEY])
    def post(self, request):
        data = self.InstanceCreateInput(data=request.data)
        data.is_valid(raise_exception=True)

        def create():
            instance = work.instance_create(data.work_request(request.user))
            return Response(InstanceOutput(instance).data, status=status.HTTP_201_CREATED)

        return idempotent(request, endpoint="instance-create", create=create)


class InstanceDetailApi(APIView):
    @extend_schema(responses=InstanceDetailOutput)
    def get(self, request, instance_id: int):
        return Response(InstanceDetailOutput(selectors.instance_get(user=request.user, instance_id=instance_id)).data)


class InstanceActionApi(APIView):
    """POST /instances/<id>/<action>/ for start, stop, restart, release."""

    action_name = ""

    @extend_schema(request=None, responses={202: InstanceOutput})
    def post(self, request, instance_id: int):
        instance = selectors.instance_get(user=request.user, instance_id=instance_id, action=self.action_name)
        work.instance_act(instance=instance, action=self.action_name, by=request.user)
        instance = selectors.instance_get(user=request.user, instance_id=instance_id, action=self.action_name)
        return Response(InstanceOutput(instance).data, status=status.HTTP_202_ACCEPTED)


class InstanceCloneApi(APIView):
    """POST /instances/<id>/clone/: a new instance with the same settings (not the disk's contents)."""

    throttle_classes = [*APIView.throttle_classes, CreateRateThrottle]

    @extend_schema(request=None, responses={201: InstanceOutput})
    def post(self, request, instance_id: int):
        # Its owner's only: a clone of another's instance would be made from their (private) image.
        instance = selectors.instance_get_owned(user=request.user, instance_id=instance_id)
        clone = work.instance_clone(instance=instance, owner=request.user)
        return Response(InstanceOutput(clone).data, status=status.HTTP_201_CREATED)


class NodeListApi(APIView):
    permission_classes = [IsAdminUser]

    class NodeOutput(serializers.Serializer):
        class GpuOutput(serializers.Serializer):
            index = serializers.IntegerField()
            uuid = serializers.CharField()
            model = serializers.CharField()
            memory_mb = serializers.IntegerField()
            allocated_milli = serializers.IntegerField()
            allocated_memory_mb = serializers.IntegerField()

        name = serializers.CharField()
        hostname = serializers.CharField()
        status = serializers.CharField()
        simulated = serializers.BooleanField()
        nvidia_runtime = serializers.BooleanField()
        cpu_cores = serializers.IntegerField()
        allocated_cpu = serializers.IntegerField()
        memory_mb = serializers.IntegerField()
        allocated_memory_mb = serializers.IntegerField()
        disk_gb = serializers.IntegerField(allow_null=True, help_text="Offered to tenants' disks; null: not counted.")
        disk_total_gb = serializers.IntegerField(allow_null=True)
        disk_free_gb = serializers.IntegerField(allow_null=True, help_text="Free at the last heartbeat.")
        docker_version = serializers.CharField()
        last_heartbeat = serializers.DateTimeField()
        gpus = GpuOutput(many=True)

    @extend_schema(responses=page_of(NodeOutput))
    def get(self, request):
        return paginated(self, cluster.node_list(), self.NodeOutput)


def form_fields(data) -> dict:
    """A multipart form's fields as the JSON body would give them (objects sent as JSON strings), without files."""
    fields = {}
    for key, value in data.items():
        if not isinstance(value, str):
            continue  # a file
        if key in ("env", "params") and value.strip().startswith("{"):
            try:
                value = json.loads(value)
            except ValueError:
                raise InvalidInput("must be a JSON object", field=key) from None
        fields[key] = value
    return fields


class CodeUpload(serializers.Serializer):
    code = serializers.FileField(
        required=False,
        help_text="A .tar.gz of your folder (at most JOB_CODE_MAX_MB): extracted into the job's data disk (each "
        "task's, for an array: sent and stored once), where its command then runs (GPUCLOUD_CODE_DIR).",
    )


def create_schema(json_input, form_input, output):
    """The OpenAPI of a create endpoint that takes JSON, or a form with the code (``with_code``)."""
    return extend_schema(
        request={"application/json": json_input, "multipart/form-data": form_input},
        responses={201: output},
        parameters=[IDEMPOTENCY_KEY],
    )


def with_code(request, form):
    """A create request's fields, checked by ``form``, and its code archive (an uploaded file, or None): JSON,
    or multipart/form-data with the archive as ``code`` and objects as JSON strings."""
    code = request.FILES.get("code")
    data = form(data=form_fields(request.data) if code is not None else request.data)
    data.is_valid(raise_exception=True)
    if code is not None and code.size > settings.JOB_CODE_MAX_MB * 1024 * 1024:
        raise InvalidInput(f"the code archive may be at most {settings.JOB_CODE_MAX_MB} MB", field="code")
    return data, code


class JobListApi(APIView):
    throttle_classes = [*APIView.throttle_classes, CreateRateThrottle]

    class JobCreateInput(WorkInput):
        request_class = JobRequest
        gpus = serializers.DecimalField(
            max_digits=6,
            decimal_places=2,
            required=False,
            help_text=f"Cards: more than one node has (at most {limits.MAX_JOB_CARDS}) runs the job over several "
            "nodes, one container per node (a gang).",
        )
        nodes = serializers.IntegerField(
            min_value=1,
            max_value=limits.MAX_NODES,
            required=False,
            allow_null=True,
            default=None,
            help_text="Exactly this many nodes, gpus / nodes cards on each (cpu_cores and memory_gb are per node); "
            "empty: one node if one has them all, else the fewest.",
        )
        name = serializers.CharField(max_length=limits.NAME_CHARS, default="job")
        command = serializers.CharField(max_length=limits.COMMAND_CHARS)
        priority = serializers.ChoiceField(choices=["high", "normal", "low"], default="normal")
        max_runtime_s = serializers.IntegerField(
            min_value=limits.MAX_RUNTIME_S.min,
            max_value=limits.MAX_RUNTIME_S.max,
            required=False,
            allow_null=True,
            default=None,
        )
        env = serializers.DictField(
            child=serializers.CharField(allow_blank=True, max_length=limits.ENV_VALUE_CHARS, trim_whitespace=False),
            required=False,
            default=dict,
            help_text=f"Environment variables: NAME -> value (at most {limits.ENV_ENTRIES}).",
        )
        spot = serializers.BooleanField(
            default=False,
            help_text="Run on spot capacity at the spot price: on-demand work may evict it; it resumes "
            "from its checkpoint.",
        )
        elastic_min = serializers.IntegerField(
            min_value=1,
            max_value=limits.MAX_JOB_CARDS,
            required=False,
            allow_null=True,
            default=None,
            help_text="An elastic job (with elastic_max; whole cards, nodes left out): the fewest cards it may run on. "
            "The scheduler starts it at gpus if that fits, else at this; grows it into idle cards and shrinks it "
            "back when queued work needs them, each resize a restart from its checkpoint; billed for the cards "
            "it holds, second by second.",
        )
        elastic_max = serializers.IntegerField(
            min_value=1,
            max_value=limits.MAX_JOB_CARDS,
            required=False,
            allow_null=True,
            default=None,
            help_text="An elastic job's most cards (at least gpus).",
        )

    @extend_schema(responses=page_of(JobOutput))
    def get(self, request):
        return paginated(self, selectors.job_list(user=request.user), JobOutput)

    class JobCreateForm(JobCreateInput, CodeUpload):
        """The same fields as a form, with the code: multipart/form-data (``env`` as a JSON string)."""

    @create_schema(JobCreateInput, JobCreateForm, JobOutput)
    def post(self, request):
        data, code = with_code(request, self.JobCreateInput)

        def create():
            archive = code.read() if code is not None else None
            job = work.job_create(data.work_request(request.user), code=archive)
            return Response(JobOutput(job, context={"request": request}).data, status=status.HTTP_201_CREATED)

        return idempotent(request, endpoint="job-create", create=create)


class JobDetailApi(APIView):
    @extend_schema(responses=JobOutput)
    def get(self, request, job_id: int):
        job = selectors.job_get(user=request.user, job_id=job_id)
        # Another's environment only when asked for (?env=1), to whoever may read it, and recorded.
        shown = request.query_params.get("env") == "1" and work.job_env_read(job, by=request.user)
        return Response(JobOutput(job, context={"request": request, "env_shown": shown}).data)


class JobActionApi(APIView):
    """POST /jobs/<id>/<action>/ for cancel and release."""

    action_name = ""

    @extend_schema(request=None, responses={202: JobOutput})
    def post(self, request, job_id: int):
        job = selectors.job_get(user=request.user, job_id=job_id, action=self.action_name)
        work.job_act(job=job, action=self.action_name, by=request.user)
        job = selectors.job_get(user=request.user, job_id=job_id, action=self.action_name)
        return Response(JobOutput(job, context={"request": request}).data, status=202)
