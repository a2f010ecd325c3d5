"""Console pages of job arrays: one page per array (progress, tasks, cancel, retry)."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_POST, require_safe

from portal import selectors
from portal.console.shortcuts import or_404
from portal.console.work import _act
from portal.services import arrays

ACTIONS = {"cancel": arrays.array_cancel, "retry": arrays.array_retry}


def array_context(array) -> dict:
    """The array, its tasks (each with its state and cost) and its progress, as the page shows them."""
    tasks = list(array.tasks.select_related("workload", "gpu_type").order_by("array_index"))
    progress = arrays.array_progress(array, tasks)
    for job in tasks:
        job.state = arrays.task_state(job)
        job.cost = progress.task_costs.get(job.workload_id)
    total = max(array.total, 1)
    bar = [(state, progress.counts[state], 100 * progress.counts[state] / total) for state in arrays.STATES]
    return {"array": array, "tasks": tasks, "progress": progress, "bar": [b for b in bar if b[1]]}


@login_required
@require_safe
def array_detail(request, array_id: int):
    array = or_404(selectors.array_get, user=request.user, array_id=array_id)
    template = "portal/_array_body.html" if request.htmx else "portal/array_detail.html"
    return render(request, template, array_context(array))


@login_required
@require_POST
def array_action(request, array_id: int, action: str):
    return _act(
        request,
        lambda: selectors.array_get(user=request.user, array_id=array_id, action=action),
        lambda array, name: ACTIONS[name](array=array, by=request.user),
        ACTIONS,
        action,
        "console-jobs",
    )
