"""Reads for the portal, each limited to what the user may see: here the catalog, instances, jobs and arrays;
in connect.py how to reach a running instance's services, in rightsizing.py the share its peak needed."""

from django.db.models import Q

from billing.models import Membership
from billing.prices import spot_now
from core.errors import Forbidden, NotFound
from core.powers import OPERATE_ANY_WORK, READ_WORK_ENV, VIEW_ANY_WORK, holds
from portal.models import GpuType, Image, Instance, Job, JobArray
from scheduler.models import WorkloadStatus
from scheduler.selectors import gpu_models_summary


def image_list(*, user):
    """Images the user may create work from: the catalog's, and their own saved ones that are ready. The catalog's
    images still building (or whose build failed) are listed too, saying so; work cannot be made from them yet."""
    catalog = Q(visibility__in=["official", "community"])
    visible = Image.objects.filter(
        (catalog | Q(owner=user)) & Q(status="ready") | catalog & Q(status__in=["building", "failed"])
    )
    # A saved image on no node is gone with its node, unless it is in the registry (its reference names
    # one: "host:port/gpucloud-saved:..."; a node-local one is "gpucloud-saved:...").
    return visible.exclude(Q(visibility="private", node__isnull=True) & ~Q(docker_ref__contains="/"))


def gpu_type_list():
    """Active GPU types, each with ``capacity`` (cards, free cards, free share, simulated) set."""
    summary = gpu_models_summary()
    types = list(GpuType.objects.filter(active=True))
    for gpu_type in types:
        gpu_type.capacity = summary.get(
            gpu_type.name,
            {"cards": 0, "free_cards": 0, "free_share": 0.0, "simulated": False, "max_cards_per_node": 0, "nodes": {}},
        )
        gpu_type.spot_now = spot_now(gpu_type.name)  # moves with load; None until first computed
    # Types that have cards in the cluster come first, cheapest first.
    return sorted(types, key=lambda t: (t.capacity["cards"] == 0, t.price_per_hour))


def seen_by(user) -> int | None:
    """Whose work ``user`` sees in lists: their own (their id), or everyone's (None) with VIEW_ANY_WORK."""
    return None if holds(user, VIEW_ANY_WORK) else user.pk


def _visible(queryset, *, user, include_released: bool):
    """Only the user's own rows (all, with VIEW_ANY_WORK); released work is history, hidden unless asked for."""
    return _owned_by(queryset, owner=seen_by(user), include_released=include_released)


def _owned_by(queryset, *, owner: int | None, include_released: bool):
    """``owner``'s rows (everyone's for None); released work is history, hidden unless asked for."""
    if owner is not None:
        queryset = queryset.filter(owner_id=owner)
    if not include_released:
        queryset = queryset.exclude(workload__status=WorkloadStatus.RELEASED)
    return queryset.select_related("workload", "workload__node", "image", "gpu_type")


def instance_list(*, user, include_released: bool = False):
    return _visible(Instance.objects.all(), user=user, include_released=include_released)


def instances_of(owner: int | None):
    """The instances a list shows to a user who sees ``owner``'s work (``seen_by``); released ones left out."""
    return _owned_by(Instance.objects.all(), owner=owner, include_released=False)


# What a team's admins may do to work its members charge to the team (the rest is the owner's).
TEAM_ADMIN_ACTIONS = frozenset({"stop", "cancel"})


def _charged_to_teams_run_by(user, queryset, action: str):
    """``queryset`` narrowed to work charged to a team ``user`` is an admin of, for ``action``; none otherwise."""
    if action not in TEAM_ADMIN_ACTIONS:
        return queryset.none()
    slugs = Membership.objects.filter(user=user, is_admin=True).values("team__slug")
    return queryset.filter(workload__team__in=slugs).select_related("workload", "workload__node")


def instance_get(*, user, instance_id: int, action: str = "") -> Instance:
    """The instance if the user may see it — or, for ``action``, act on it: its owner, OPERATE_ANY_WORK, or an admin of
    the team it is charged to (for TEAM_ADMIN_ACTIONS); NotFound otherwise (never a leak of existence), Forbidden
    for one the user may see but not act on."""
    return _get(
        user, instance_list(user=user, include_released=True), Instance.objects, instance_id, action, "instance"
    )


def _get(user, visible, every, pk: int, action: str, what: str):
    """What ``instance_get`` and ``job_get`` find (``visible``: what the user sees, ``every``: all of that kind)."""
    found = visible.filter(pk=pk).first()
    if found is not None and (not action or found.owner_id == user.pk or holds(user, OPERATE_ANY_WORK)):
        return found
    charged = _charged_to_teams_run_by(user, every.filter(pk=pk), action).first()
    if charged is not None:
        return charged
    if found is not None:
        raise Forbidden(f"you may see this {what} but not {action} it: that needs the {OPERATE_ANY_WORK} permission")
    raise NotFound(f"no such {what}")


def may_read_env(*, user, workload) -> bool:
    """Whether ``user`` may read ``workload``'s environment (API keys live there): its owner, or READ_WORK_ENV."""
    return workload.owner_id == user.pk or holds(user, READ_WORK_ENV)


def instance_get_owned(*, user, instance_id: int) -> Instance:
    """The user's own instance, for what only its owner may do (a shell, its files); NotFound otherwise, staff too."""
    instance = Instance.objects.filter(pk=instance_id, owner=user).select_related("workload__node").first()
    if instance is None:
        raise NotFound("no such instance")
    return instance


def job_list(*, user, include_released: bool = False):
    # A gang's members come with it (one query for the page, not one per job).
    jobs = Job.objects.select_related("workload__spec").prefetch_related("workload__members")
    return _visible(jobs, user=user, include_released=include_released)


def job_get_owned(*, user, job_id: int) -> Job:
    """The user's own job, for what only its owner may do (a shell, its files); NotFound otherwise, staff too."""
    job = Job.objects.filter(pk=job_id, owner=user).select_related("workload__node").first()
    if job is None:
        raise NotFound("no such job")
    return job


def job_get(*, user, job_id: int, action: str = "") -> Job:
    """As ``instance_get``, for a job."""
    return _get(user, job_list(user=user, include_released=True), Job.objects, job_id, action, "job")


def array_list(*, user):
    """Job arrays the user may see (their own; all, with VIEW_ANY_WORK), newest first."""
    arrays = JobArray.objects.all() if holds(user, VIEW_ANY_WORK) else JobArray.objects.filter(owner=user)
    return arrays.order_by("-created_at", "-id")


def array_get(*, user, array_id: int, action: str = "") -> JobArray:
    """The array if the user may see it, or, for ``action``, act on it (its owner, OPERATE_ANY_WORK)."""
    array = array_list(user=user).filter(pk=array_id).first()
    if array is None:
        raise NotFound("no such array")
    if action and array.owner_id != user.pk and not holds(user, OPERATE_ANY_WORK):
        raise Forbidden(f"you may see this array but not {action} it: that needs the {OPERATE_ANY_WORK} permission")
    return array
