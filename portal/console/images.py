"""Images in the console: the catalog and the user's saved images; saving an instance; deleting a saved image."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST, require_safe

from core.errors import ServiceError
from portal import selectors
from portal.console.shortcuts import or_404
from portal.models import Image, ImageStatus
from portal.services import images


@login_required
@require_safe
def image_page(request):
    mine = list(images.saved_image_list(user=request.user))
    offered = [ImageStatus.READY, ImageStatus.BUILDING, ImageStatus.FAILED]  # not ready yet: shown, saying so
    catalog = Image.objects.filter(Q(visibility__in=["official", "community"]), status__in=offered)
    busy = any(i.status in (ImageStatus.SAVING, ImageStatus.DELETING) for i in mine)
    context = {"mine": mine, "catalog": catalog, "busy": busy}
    return render(request, "portal/_image_rows.html" if request.htmx else "portal/images.html", context)


@login_required
@require_POST
def instance_save_image(request, instance_id: int):
    instance = or_404(selectors.instance_get, user=request.user, instance_id=instance_id, action="save-image")
    try:
        image = images.image_save(instance=instance, name=request.POST.get("name", ""), by=request.user)
    except ServiceError as exc:
        messages.error(request, exc.message)
        return redirect("console-instance", instance_id=instance.pk)
    messages.success(request, _("Saving %(instance)s as image %(image)s …") % {"instance": instance, "image": image})
    return redirect("console-images")


@login_required
@require_POST
def image_delete(request, image_id: int):
    image = images.saved_image_list(user=request.user).filter(pk=image_id).first()
    if image is None:
        raise Http404("no such image")
    try:
        images.image_delete(image=image)
        messages.info(request, _("Deleting image %(image)s from its node.") % {"image": image})
    except ServiceError as exc:
        messages.error(request, exc.message)
    return redirect("console-images")
