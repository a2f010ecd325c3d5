"""Saved images: a stopped instance's system disk committed as a private image of its owner.

The node agent commits the container on the node that holds it (Docker commit),
pushes it to the platform's registry when there is one (settings.REGISTRY), and
replies with the size. An image in the registry belongs to no node: instances created
from it start on any host, which pulls it on first use, and removing a host loses
nothing. Without a registry the image exists only on that node, and instances created
from it are pinned there. The data disk (/root/autodl-tmp) is a volume and is not
saved, as on AutoDL. Deleting removes it from the registry (a scheduler-worker task,
then a best-effort removal from every host's engine) or from its node, then hides the
row (released instances still name it in their history).
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone

from core.clock import db_now
from core.errors import Conflict, InvalidInput, TooMany
from core.messages import ToNode, ToScheduler, send, send_after_commit
from portal import limits
from portal.models import Image, ImageStatus, ImageVisibility, Instance
from portal.services import audit
from portal.services.slow import slow_operation_admit, slow_operations_lock
from scheduler import registry
from scheduler.models import Node, NodeStatus, WorkloadStatus

REPOSITORY = "gpucloud-saved"
log = logging.getLogger(__name__)


def saved_image_list(*, user):
    """The user's own saved images, newest first (deleted ones are history, not listed)."""
    return (
        Image.objects.filter(owner=user, visibility=ImageVisibility.PRIVATE)
        .exclude(status=ImageStatus.DELETED)
        .select_related("node", "source_instance")
        .order_by("-created_at")
    )


def image_save(*, instance: Instance, name: str, by=None) -> Image:
    """Start saving a stopped instance as a private image (its owner's); the row is ``saving`` until the node
    replies. ``by``: who asked (an operator's save is audited)."""
    name = (name or "").strip()
    if not name or len(name) > limits.NAME_CHARS:
        raise InvalidInput(f"give the image a name of 1 to {limits.NAME_CHARS} characters", field="name")
    with transaction.atomic():
        slow_operation_admit(instance.owner)
        workload = instance.workload.__class__.objects.select_for_update().get(pk=instance.workload_id)
        if workload.status != WorkloadStatus.STOPPED:
            raise Conflict(f"stop the instance before saving it as an image; it is {workload.status}")
        node = workload.disk_node
        if node is None:
            raise Conflict("the instance's disk is on no node any more; it cannot be saved")
        if instance.saved_images.filter(status=ImageStatus.SAVING).exists():
            raise Conflict("this instance is already being saved; wait until it is ready")
        if saved_image_list(user=instance.owner).count() >= settings.MAX_SAVED_IMAGES:
            raise TooMany(f"you have {settings.MAX_SAVED_IMAGES} saved images, the limit: delete one first")
        source = instance.image
        image = Image.objects.create(
            name=name,
            framework=source.framework,
            framework_version=source.framework_version,
            cuda_version=source.cuda_version,
            python_version=source.python_version,
            docker_ref="",
            visibility=ImageVisibility.PRIVATE,
            owner=instance.owner,
            status=ImageStatus.SAVING,
            status_changed_at=Now(),
            node=node,
            source_instance=instance,
        )
        # In a registry each saved image has a repository of its own: a host's push grant names one image.
        repository = f"{REPOSITORY}/u{instance.owner_id}-i{image.pk}" if settings.REGISTRY else REPOSITORY
        image.docker_ref = registry.registry_ref(f"{repository}:{settings.DEPLOYMENT_ID}-{image.pk}")
        image.save(update_fields=["docker_ref"])
        audit.power_used(by=by, owner_id=instance.owner_id, action="save-image", target=f"instance {instance.pk}")
        send_after_commit(
            ToNode.IMAGE_COMMIT, workload.pk, image.docker_ref, ToScheduler.IMAGE_SAVED, image.pk, node=node.name
        )
    return image


def image_saved(image_id: int, size_bytes: int, error: str, *, host: str | None = None) -> None:
    """The node's reply to a commit (and push): ready — on every host if it is in the registry — or failed.
    ``host``: the host that signed the reply (None: the control plane); taken only from the image's node."""
    image = Image.objects.filter(pk=image_id, status=ImageStatus.SAVING).select_related("node").first()
    if image is None or not _from_its_node(image, host):
        return
    update = {"status": ImageStatus.FAILED, "status_reason": f"saving failed: {error}"[:255]}
    if not error:
        update = {"status": ImageStatus.READY, "status_reason": "", "size_bytes": size_bytes}
        if image.in_registry:
            update["node"] = None  # any host pulls it
    Image.objects.filter(pk=image_id, status=ImageStatus.SAVING).update(**update)


def image_delete(*, image: Image) -> Image:
    """Remove a saved image from the registry or its node (refused while instances that are not released use it)."""
    with transaction.atomic():
        slow_operations_lock(image.owner)
        image = Image.objects.select_for_update().get(pk=image.pk)
        if image.status in (ImageStatus.SAVING, ImageStatus.DELETING):
            raise Conflict(f"the image is {image.status}; wait until that is done")
        in_use = Instance.objects.filter(image=image).exclude(workload__status=WorkloadStatus.RELEASED)
        if in_use.exists():
            names = ", ".join(in_use.values_list("name", flat=True)[:5])
            raise Conflict(f"instances still use this image ({names}): release them first")
        # A ready image in the registry is deleted there by the scheduler worker, which then answers.
        from_registry = image.in_registry and image.node is None and image.status == ImageStatus.READY
        # Nothing on a node to wait for (it is gone, or the commit failed): deleted now. A failed commit may
        # still have left a tag behind, so its node is told too; the reply finds nothing "deleting" to change.
        gone_already = not from_registry and (image.node is None or image.status == ImageStatus.FAILED)
        if not gone_already:
            slow_operation_admit(image.owner)
        image.status = ImageStatus.DELETED if gone_already else ImageStatus.DELETING
        image.status_changed_at = Now()
        image.save(update_fields=["status", "status_changed_at"])
        if from_registry:
            send_after_commit(ToScheduler.IMAGE_DELETE, image.pk)
        elif image.node is not None:
            send_after_commit(
                ToNode.IMAGE_REMOVE, image.docker_ref, ToScheduler.IMAGE_REMOVED, image.pk, node=image.node.name
            )
    return image


def image_delete_from_registry(image_id: int) -> None:
    """Delete a ``deleting`` image from the registry (scheduler worker), then from every host's engine.

    The registry's answer decides: deleted (also when it was gone already), or back to
    ready saying why not. The hosts' local copies are a cache: each live host is told to
    drop its copy, with no reply awaited (a host that is down keeps an unused tag).
    """
    image = Image.objects.filter(pk=image_id, status=ImageStatus.DELETING).first()
    if image is None:
        return
    error = ""
    try:
        registry.manifest_delete(registry.image_name(image.docker_ref))
    except registry.RegistryError as exc:
        error = exc.message
    image_removed(image.pk, 0, error)
    if not error:
        for node in Node.objects.exclude(status=NodeStatus.LOST).values_list("name", flat=True):
            send(ToNode.IMAGE_REMOVE, image.docker_ref, "", 0, node=node)


def image_removed(image_id: int, size_bytes: int, error: str, *, host: str | None = None) -> None:
    """The node's reply to a removal: deleted, or back to ready saying why not (only from the image's node)."""
    image = Image.objects.filter(pk=image_id, status=ImageStatus.DELETING).select_related("node").first()
    if image is None or not _from_its_node(image, host):
        return
    update = {"status": ImageStatus.DELETED, "status_reason": f"deleted {timezone.now():%Y-%m-%d %H:%M}"}
    if error:
        update = {"status": ImageStatus.READY, "status_reason": f"could not delete: {error}"[:255]}
    Image.objects.filter(pk=image_id, status=ImageStatus.DELETING).update(**update)


def _from_its_node(image: Image, host: str | None) -> bool:
    if host is None or (image.node is not None and image.node.name == host):
        return True
    log.warning("refused host %s's reply about image %s: it is not that image's node", host, image.pk)
    return False


def images_overdue() -> list[int]:
    """Saves and deletions that got no answer by their deadline have failed, saying so; returns their ids.

    Their node task may not outlive its time limit, which each deadline exceeds, so a late
    answer cannot change them back (one that comes anyway finds nothing saving or deleting).
    """
    now = db_now()
    changed = []
    for status, deadline, update in [
        (
            ImageStatus.SAVING,
            settings.IMAGE_SAVE_DEADLINE_S,
            {"status": ImageStatus.FAILED, "status_reason": "saving failed: its node did not finish within {} s"},
        ),
        (
            ImageStatus.DELETING,
            settings.IMAGE_DELETE_DEADLINE_S,
            {"status": ImageStatus.READY, "status_reason": "could not delete: no answer within {} s; delete it again"},
        ),
    ]:
        cutoff = now - timedelta(seconds=deadline)
        for image_id in Image.objects.filter(status=status, status_changed_at__lt=cutoff).values_list("pk", flat=True):
            reason = update["status_reason"].format(deadline)
            if Image.objects.filter(pk=image_id, status=status).update(**{**update, "status_reason": reason}):
                log.warning("image %s was %s for over %s s: %s", image_id, status, deadline, reason)
                changed.append(image_id)
    return changed


def image_busy(instance: Instance) -> bool:
    """Whether the instance is being saved (it may not start or be released meanwhile)."""
    return instance.saved_images.filter(status=ImageStatus.SAVING).exists()
