"""Instance pages beside the list: live GPUs and a terminal (its owner), and the whole cluster (staff).

The pages render what the database knows (cards, shares, the last day of
minute rollups); the live numbers come over the monitor WebSockets
(``portal/sockets/monitor.py``) into ``static/js/monitor.js``.
"""

from datetime import timedelta

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_safe

from billing.statements import cost_so_far
from portal import selectors
from portal.console.shortcuts import or_404
from portal.selectors.connect import services_of
from portal.selectors.rightsizing import rightsizing_advice
from portal.services.housekeeping import release_due_at
from portal.services.logs import logs_panel
from scheduler.models import Allocation, WorkloadGpuMinute
from scheduler.selectors import disk_held, gpu_models_summary, node_list

LONG_CHART = timedelta(hours=24)


@login_required
@require_safe
def instance_monitor(request, instance_id: int):
    instance = or_404(selectors.instance_get, user=request.user, instance_id=instance_id)
    workload = instance.workload
    shares = Allocation.objects.filter(workload=workload).select_related("gpu").order_by("gpu__index")
    minutes = WorkloadGpuMinute.objects.filter(workload=workload, minute__gte=timezone.now() - LONG_CHART)
    config = {
        "socket": f"/ws/monitor/instances/{instance.pk}/",
        "window_s": 15 * 60,
        "gpus": [{"uuid": a.gpu.uuid, "i": a.gpu.index, "model": a.gpu.model, "mem_cap": a.memory_mb} for a in shares],
        "cpu_limit": workload.cpu_cores,
        "mem_limit": workload.memory_mb,
        "minutes": [
            [m.minute.timestamp(), m.gpu.uuid, m.util_avg, m.util_max, m.mem_max_mb]
            for m in minutes.select_related("gpu").order_by("minute")
        ],
    }
    return render(request, "portal/instance_monitor.html", {"instance": instance, "config": config})


@staff_member_required
@require_safe
def cluster_monitor(request):
    nodes = node_list().order_by("name")
    holders = {}
    for a in Allocation.objects.select_related("workload__owner", "workload__instance").filter(gpu__node__in=nodes):
        holders.setdefault(a.gpu_id, []).append(a)
    held = disk_held()
    for node in nodes:
        node.disk_held_gb = held.get(node.pk, 0)  # what tenants' disks reserve there, of what it offers (disk_gb)
        for gpu in node.gpus.all():
            gpu.holders = holders.get(gpu.pk, [])
    return render(
        request,
        "portal/cluster_monitor.html",
        {"nodes": nodes, "models": sorted(gpu_models_summary().items()), "config": {"socket": "/ws/monitor/cluster/"}},
    )


@login_required
@require_safe
def instance_terminal(request, instance_id: int):
    """A shell in the owner's running instance (the socket refuses anyone else, and work not running)."""
    instance = or_404(selectors.instance_get_owned, user=request.user, instance_id=instance_id)
    return render(
        request,
        "portal/instance_terminal.html",
        {"instance": instance, "config": {"socket": f"/ws/terminal/instances/{instance.pk}/"}},
    )


@login_required
@require_safe
def instance_logs(request, instance_id: int):
    """The owner's instance's output: followed live, searched, downloaded (``_logs.html``)."""
    instance = or_404(selectors.instance_get_owned, user=request.user, instance_id=instance_id)
    context = {"instance": instance, "logs": logs_panel("instances", instance.pk)}
    return render(request, "portal/instance_logs.html", context)


@login_required
@require_safe
def instance_detail(request, instance_id: int):
    """One instance: what it is, where it runs, what it cost, what it can do, and its history."""
    instance = or_404(selectors.instance_get, user=request.user, instance_id=instance_id)
    workload = instance.workload
    instance.cost = cost_so_far([workload.pk]).get(workload.pk)
    return render(
        request,
        "portal/instance_detail.html",
        {
            "instance": instance,
            "w": workload,
            "events": workload.events.order_by("-created_at", "-id")[:100],
            "shares": Allocation.objects.filter(workload=workload).select_related("gpu").order_by("gpu__index"),
            "release_at": release_due_at(instance),
            "services": services_of(workload),
            "move": workload.moves.select_related("source", "target").first(),
            "can_move": bool(settings.REGISTRY),
            "rightsizing": rightsizing_advice(instance),
        },
    )
