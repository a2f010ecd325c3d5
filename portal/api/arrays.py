"""REST API of job arrays (sweeps): submit, list, read, cancel, retry."""

from decimal import Decimal

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from portal import limits, selectors
from portal.api.idempotency import idempotent
from portal.api.pagination import Pages, page_of
from portal.api.views import CodeUpload, JobListApi, create_schema, with_code
from portal.models import Fallback, JobArray
from portal.services import arrays
from portal.services.requests import ArrayRequest
from portal.throttles import CreateRateThrottle


class CountsOutput(serializers.Serializer):
    done = serializers.IntegerField()
    running = serializers.IntegerField(help_text="Starting, running or stopping.")
    queued = serializers.IntegerField()
    failed = serializers.IntegerField()
    cancelled = serializers.IntegerField()


class TaskOutput(serializers.Serializer):
    index = serializers.IntegerField(help_text="Its index (SLURM_ARRAY_TASK_ID, GPUCLOUD_ARRAY_INDEX).")
    job = serializers.IntegerField(help_text="The task's job id (GET /jobs/<id>/).")
    params = serializers.DictField(child=serializers.CharField())
    status = serializers.ChoiceField(choices=arrays.STATES)
    spot = serializers.BooleanField(help_text="On spot capacity now (false once it fell back to on-demand).")
    preemptions = serializers.IntegerField()
    cost = serializers.DecimalField(max_digits=14, decimal_places=2, help_text="Charged so far, and not yet settled.")
    exit_code = serializers.IntegerField(allow_null=True)


class ArrayOutput(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    status = serializers.CharField()
    status_reason = serializers.CharField()
    counts = CountsOutput()
    total = serializers.IntegerField()
    max_running = serializers.IntegerField(allow_null=True)
    spot = serializers.BooleanField()
    fallback = serializers.CharField()
    max_preemptions = serializers.IntegerField()
    deadline = serializers.DateTimeField(allow_null=True)
    budget = serializers.DecimalField(max_digits=14, decimal_places=2, allow_null=True)
    cost = serializers.DecimalField(max_digits=14, decimal_places=2)
    currency = serializers.CharField()
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    tasks = TaskOutput(many=True)


def array_document(array: JobArray) -> dict:
    tasks = list(array.tasks.select_related("workload").order_by("array_index"))
    progress = arrays.array_progress(array, tasks)
    document = {
        f: getattr(array, f)
        for f in ("id", "name", "status", "status_reason", "total", "max_running", "spot", "fallback")
        + ("max_preemptions", "deadline", "budget", "currency", "created_at", "finished_at")
    }
    document["counts"] = progress.counts
    document["cost"] = progress.cost
    document["tasks"] = [
        {
            "index": job.array_index,
            "job": job.pk,
            "params": job.params,
            "status": arrays.task_state(job),
            "spot": job.workload.spot,
            "preemptions": job.workload.preemptions,
            "cost": progress.task_costs.get(job.workload_id, arrays.ZERO),
            "exit_code": job.workload.exit_code,
        }
        for job in tasks
    ]
    return ArrayOutput(document).data


class ArrayListApi(APIView):
    """GET: your arrays, newest first. POST: submit an array (every job field, plus the array's own)."""

    throttle_classes = [*APIView.throttle_classes, CreateRateThrottle]

    class ArrayCreateInput(JobListApi.JobCreateInput):
        request_class = ArrayRequest
        nodes = None  # each task on the nodes the scheduler chooses
        elastic_min = elastic_max = None  # each task at the size asked
        array = serializers.CharField(
            max_length=255,
            required=False,
            allow_blank=True,
            help_text='Slurm indices: "0-31%4" (0..31, at most 4 running at once), "0-9", "1,3,5%2", "0-15:4".',
        )
        params = serializers.DictField(
            child=serializers.ListField(child=serializers.JSONField()),
            required=False,
            help_text='A grid: {"lr": ["1e-3", "3e-4"], "bs": ["32", "64"]}, one task per combination.',
        )
        max_running = serializers.IntegerField(
            min_value=1, max_value=limits.ARRAY_TASKS, required=False, allow_null=True, default=None
        )
        spot = serializers.BooleanField(default=True, help_text="Tasks run on spot capacity (the default for arrays).")
        fallback = serializers.ChoiceField(
            choices=Fallback.values,
            default=Fallback.NONE,
            help_text="on-demand: a task preempted more than max_preemptions times, or any task once the "
            "deadline has passed, runs on-demand from then on (resuming from its checkpoint).",
        )
        max_preemptions = serializers.IntegerField(min_value=0, max_value=1000, default=3)
        deadline = serializers.DateTimeField(required=False, allow_null=True, default=None)
        budget = serializers.DecimalField(
            max_digits=14,
            decimal_places=2,
            min_value=Decimal("0.01"),
            required=False,
            allow_null=True,
            default=None,
            help_text="Most the whole array may cost (account currency); it is stopped before it passes it.",
        )

    @extend_schema(responses=page_of(ArrayOutput))
    def get(self, request):
        pages = Pages()
        page = pages.paginate_queryset(selectors.array_list(user=request.user), request, view=self)
        return pages.get_paginated_response([array_document(a) for a in page])

    class ArrayCreateForm(ArrayCreateInput, CodeUpload):
        """The same fields as a form, with the code: multipart/form-data (``env`` and ``params`` as JSON strings)."""

    @create_schema(ArrayCreateInput, ArrayCreateForm, ArrayOutput)
    def post(self, request):
        data, code = with_code(request, self.ArrayCreateInput)

        def create():
            archive = code.read() if code is not None else None
            array = arrays.array_create(data.work_request(request.user), code=archive)
            return Response(array_document(array), status=status.HTTP_201_CREATED)

        return idempotent(request, endpoint="array-create", create=create)


class ArrayDetailApi(APIView):
    @extend_schema(responses=ArrayOutput)
    def get(self, request, array_id: int):
        return Response(array_document(selectors.array_get(user=request.user, array_id=array_id)))


ARRAY_ACTIONS = {"cancel": arrays.array_cancel, "retry": arrays.array_retry}


class ArrayActionApi(APIView):
    """POST /arrays/<id>/cancel/ (queued tasks leave the queue, running ones stop) and /retry/ (failed and
    cancelled tasks queue again)."""

    action_name = ""

    @extend_schema(request=None, responses={202: ArrayOutput})
    def post(self, request, array_id: int):
        array = selectors.array_get(user=request.user, array_id=array_id, action=self.action_name)
        ARRAY_ACTIONS[self.action_name](array=array, by=request.user)
        return Response(array_document(selectors.array_get(user=request.user, array_id=array_id)), status=202)
