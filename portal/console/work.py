"""Console pages: instances (live list, create form, actions) and batch jobs (list, submit, detail); the health
check and the throttled sign-in page."""

from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import LoginView
from django.http import HttpResponseRedirect, JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from billing.prices import rate_card_now
from billing.statements import cost_so_far
from billing.teams import teams_of
from core.errors import InvalidInput, ServiceError
from portal import selectors
from portal.console.forms import InstanceCreateForm, JobCreateForm
from portal.console.shortcuts import or_404
from portal.services import arrays, work
from portal.services.housekeeping import job_kept_until, release_due_at
from portal.services.logs import logs_panel, member_tail
from portal.services.requests import ArrayRequest, InstanceRequest, JobRequest
from portal.services.work import HIGH_PRIORITY_PERMISSION
from portal.throttles import sign_in_wait
from scheduler import sharedfs
from scheduler.models import Priority


@require_safe
def healthz(request):
    """A constant answer for load balancers (and the baseline of bench/api_load.py)."""
    return JsonResponse({"ok": True})


class ThrottledLoginView(LoginView):
    """The sign-in form, with a limit on attempts per client address and username (429 past it)."""

    http_method_names = ["get", "head", "post", "options"]  # not FormView's PUT, another way to post

    def post(self, request, *args, **kwargs):
        wait = sign_in_wait(request)
        if wait is not None:
            response = render(
                request,
                "registration/login.html",
                {
                    "form": self.get_form(),
                    "throttled": _("Too many sign-in attempts: try again in %(wait)s s.") % {"wait": wait},
                },
                status=429,
            )
            response["Retry-After"] = str(wait)
            return response
        return super().post(request, *args, **kwargs)


def _create(request, form_class, template: str, create):
    """Show the form; on a valid POST call ``create(data)``; service errors go back to the field they name."""
    gpu_types = selectors.gpu_type_list()
    images = list(selectors.image_list(user=request.user).select_related("node"))
    initial = {"image": request.GET["image"]} if request.GET.get("image", "").isdigit() else {}
    if request.GET.get("team"):
        initial["team"] = request.GET["team"]
    teams = teams_of(request.user)
    form = form_class(request.POST or None, gpu_types=gpu_types, images=images, teams=teams, initial=initial)
    if "priority" in form.fields and not request.user.has_perm(HIGH_PRIORITY_PERMISSION):
        priority = form.fields["priority"]  # High is offered to those an administrator allows only
        priority.choices = [(value, label) for value, label in priority.choices if value != Priority.HIGH]
    if request.method == "POST" and form.is_valid():
        try:
            return create(dict(form.cleaned_data))
        except ServiceError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
    # What each card includes (the rate card in force), capped at the most one node with the type offers:
    # the create page scales CPU and memory with the cards from these, at once as the cards change.
    node_limits = {}
    for t in gpu_types:
        card = rate_card_now(t.name)
        node_limits[t.pk] = {
            "cpu": max((n["cpu_cores"] for n in t.capacity["nodes"].values()), default=0),
            "memory_gb": max((n["memory_gb"] for n in t.capacity["nodes"].values()), default=0),
            "cpus_per_card": card.cpus_per_card if card else None,
            "memory_gb_per_card": card.memory_gb_per_card if card else None,
        }
    return render(request, template, {"form": form, "gpu_types": gpu_types, "node_limits": node_limits})


def _act(request, get, act, actions: dict, action: str, back: str):
    """Run a named action on an object the user may touch; the outcome is a flash message.

    What the user may not see is a 404, as in the API, never a redirect that tells it exists.
    """
    obj = or_404(get)
    try:
        if action not in actions:
            raise ServiceError(f"unknown action {action}")
        act(obj, action)
        messages.info(request, _("%(action)s requested for %(name)s.") % {"action": action.capitalize(), "name": obj})
    except ServiceError as exc:
        messages.error(request, exc.message)
    # Back to the page the button was on (the list, or the instance's own page), if it is ours.
    here = request.POST.get("next", "")
    ours = url_has_allowed_host_and_scheme(here, allowed_hosts={request.get_host()}, require_https=request.is_secure())
    if here.startswith("/") and ours:
        return HttpResponseRedirect(here)  # a path, never a view name for redirect() to look up
    return redirect(back)


def _list(request, template: str, rows_template: str, context: dict):
    return render(request, rows_template if request.htmx else template, context)


@login_required
@require_safe
def instance_list(request):
    instances = list(selectors.instance_list(user=request.user))
    costs = cost_so_far([i.workload_id for i in instances])
    now = timezone.now()
    for instance in instances:
        instance.cost = costs.get(instance.workload_id)
        release_at = release_due_at(instance)
        warn_from = timedelta(days=settings.HOUSEKEEPING_WARNING_DAYS)
        instance.release_at = release_at if release_at and release_at - now <= warn_from else None
        if instance.stop_warned_at:
            instance.stop_due = instance.stop_warned_at + timedelta(seconds=settings.IDLE_WARNING_S)
        util = instance.workload.gpu_utilization  # the last minute's mean over its share (monitoring)
        instance.gpu_busy, instance.idle = None, False
        if instance.workload.status == "running" and util is not None and not instance.workload.no_gpu:
            instance.gpu_busy = round(util * 100)
            instance.idle = util < settings.SCHEDULER_IDLE_UTIL
    context = {"instances": instances}
    return _list(request, "portal/instance_list.html", "portal/_instance_rows.html", context)


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def instance_create(request):
    def create(data):
        instance = work.instance_create(InstanceRequest.of(request.user, data))
        messages.success(
            request, _("Instance %(name)s created; it starts as soon as a card is placed.") % {"name": instance.name}
        )
        return redirect("console-instances")

    return _create(request, InstanceCreateForm, "portal/instance_create.html", create)


@login_required
@require_POST
def instance_action(request, instance_id: int, action: str):
    return _act(
        request,
        lambda: selectors.instance_get(user=request.user, instance_id=instance_id, action=action),
        lambda instance, name: work.instance_act(instance=instance, action=name, by=request.user),
        work.ACTIONS,
        action,
        "console-instances",
    )


@login_required
@require_safe
def job_list(request):
    """Jobs submitted alone, and each job array as one row (its tasks are on the array's page)."""
    entries = [{"job": job, "at": job.created_at} for job in selectors.job_list(user=request.user).filter(array=None)]
    for array in selectors.array_list(user=request.user).prefetch_related("tasks__workload"):
        counts = arrays.array_counts(list(array.tasks.all()))
        entries.append({"array": array, "counts": counts, "at": array.created_at})
    entries.sort(key=lambda entry: entry["at"], reverse=True)
    return _list(request, "portal/job_list.html", "portal/_job_rows.html", {"entries": entries})


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def job_create(request):
    def create(data):
        spec, nodes = data.pop("array"), data.pop("nodes")
        elastic = {"elastic_min": data.pop("elastic_min"), "elastic_max": data.pop("elastic_max")}
        if spec and nodes and nodes > 1:
            raise InvalidInput(_("the tasks of an array run on one node each"), field="nodes")
        if spec and any(v is not None for v in elastic.values()):
            raise InvalidInput(_("the tasks of an array have one size each: leave elastic out"), field="elastic_min")
        if spec:  # one task per index: a job array, on the page of its own
            array = arrays.array_create(ArrayRequest.of(request.user, dict(data, array=spec)))
            messages.success(request, _("Array %(name)s queued.") % {"name": array.name})
            return redirect("console-array", array_id=array.pk)
        job = work.job_create(JobRequest.of(request.user, dict(data, nodes=nodes, **elastic)))
        messages.success(request, _("Job %(name)s queued.") % {"name": job.name})
        return redirect("console-job", job_id=job.pk)

    return _create(request, JobCreateForm, "portal/job_create.html", create)


@login_required
@require_safe
def job_detail(request, job_id: int):
    job = or_404(selectors.job_get, user=request.user, job_id=job_id)
    members = list(job.workload.members.all())
    if members:  # each member's cards on its node, as long as the gang holds them
        held = job.workload.allocations.select_related("gpu__node").order_by("gpu__index")
        for member in members:
            member.cards = [f"gpu{a.gpu.index}" for a in held if a.gpu.node_id == member.node_id]
    context = {"job": job, "events": job.workload.events.all(), "members": members}
    context["auto_tmpdir"], context["kept_until"] = sharedfs.job_tmpdir(job.workload.uid), job_kept_until(job)
    # Another's environment (API keys live there): only when asked for, to whoever may read it, and recorded.
    mine = job.owner_id == request.user.pk
    shown = mine or (request.GET.get("env") == "1" and work.job_env_read(job, by=request.user))
    context["env_shown"] = shown
    context["env_hidden"] = not shown and selectors.may_read_env(user=request.user, workload=job.workload)
    if mine:  # a log is its owner's only (staff see the last lines kept)
        context["logs"] = logs_panel("jobs", job.pk)
        for member in members:  # each member's last lines, from its own host
            member.last_lines = member_tail(job.workload, member.rank)
    return render(request, "portal/job_detail.html", context)


@login_required
@require_POST
def job_action(request, job_id: int, action: str):
    return _act(
        request,
        lambda: selectors.job_get(user=request.user, job_id=job_id, action=action),
        lambda job, name: work.job_act(job=job, action=name, by=request.user),
        work.JOB_ACTIONS,
        action,
        "console-jobs",
    )


@login_required
@require_POST
def instance_disk(request, instance_id: int):
    """Grow the data disk from the instance page."""
    instance = or_404(selectors.instance_get, user=request.user, instance_id=instance_id, action="grow-disk")
    try:
        size = int(request.POST.get("disk_gb", ""))
    except ValueError:
        messages.error(request, _("Disk size: give a whole number of GB."))
    else:
        try:
            work.instance_grow_disk(instance=instance, disk_gb=size, by=request.user)
            messages.info(request, _("Growing the data disk to %(size)s GB.") % {"size": size})
        except ServiceError as exc:
            messages.error(request, exc.message)
    return redirect("console-instance", instance_id=instance.pk)
