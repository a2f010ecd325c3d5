"""Console pages: instance list (live), create form, actions."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from portal import selectors, services
from portal.forms import InstanceCreateForm, JobCreateForm
from scheduler.errors import ServiceError


@login_required
def instance_list(request):
    context = {"instances": selectors.instance_list(user=request.user)}
    template = "portal/_instance_rows.html" if request.htmx else "portal/instance_list.html"
    return render(request, template, context)


@login_required
def instance_create(request):
    gpu_types = selectors.gpu_type_list()
    images = selectors.image_list(user=request.user)
    form = InstanceCreateForm(request.POST or None, gpu_types=gpu_types, images=images)
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        data["image_id"], data["gpu_type_id"] = data.pop("image"), data.pop("gpu_type")
        try:
            instance = services.instance_create(owner=request.user, **data)
        except ServiceError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        else:
            messages.success(request, f"Instance {instance.name} created; it starts as soon as a card is placed.")
            return redirect("console-instances")
    return render(request, "portal/instance_create.html", {"form": form, "gpu_types": gpu_types})


@login_required
@require_POST
def instance_action(request, instance_id: int, action: str):
    try:
        instance = selectors.instance_get(user=request.user, instance_id=instance_id)
        if action not in services.ACTIONS:
            raise ServiceError(f"unknown action {action}")
        services.instance_act(instance=instance, action=action)
        messages.info(request, f"{action.capitalize()} requested for {instance.name}.")
    except ServiceError as exc:
        messages.error(request, exc.message)
    return redirect("console-instances")


@login_required
def job_list(request):
    context = {"jobs": selectors.job_list(user=request.user)}
    template = "portal/_job_rows.html" if request.htmx else "portal/job_list.html"
    return render(request, template, context)


@login_required
def job_create(request):
    gpu_types = selectors.gpu_type_list()
    images = selectors.image_list(user=request.user)
    form = JobCreateForm(request.POST or None, gpu_types=gpu_types, images=images)
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        data["image_id"], data["gpu_type_id"] = data.pop("image"), data.pop("gpu_type")
        try:
            job = services.job_create(owner=request.user, **data)
        except ServiceError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        else:
            messages.success(request, f"Job {job.name} queued.")
            return redirect("console-job", job_id=job.pk)
    return render(request, "portal/job_create.html", {"form": form})


@login_required
def job_detail(request, job_id: int):
    try:
        job = selectors.job_get(user=request.user, job_id=job_id)
    except ServiceError as exc:
        messages.error(request, exc.message)
        return redirect("console-jobs")
    return render(request, "portal/job_detail.html", {"job": job, "events": job.workload.events.all()})


@login_required
@require_POST
def job_action(request, job_id: int, action: str):
    try:
        job = selectors.job_get(user=request.user, job_id=job_id)
        if action not in services.JOB_ACTIONS:
            raise ServiceError(f"unknown action {action}")
        services.job_act(job=job, action=action)
        messages.info(request, f"{action.capitalize()} requested for {job.name}.")
    except ServiceError as exc:
        messages.error(request, exc.message)
    return redirect("console-jobs")
