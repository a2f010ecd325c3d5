"""The account page: API token (create, replace, revoke) and password; and cloning an instance from the list."""

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse_lazy
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST
from rest_framework.authtoken.models import Token

from portal import selectors, services
from portal.shortcuts import or_404
from scheduler.errors import ServiceError


@login_required
def account_page(request):
    token = Token.objects.filter(user=request.user).first()
    return render(request, "portal/account.html", {"token": token})


@login_required
@require_POST
def account_token(request, action: str):
    """``create`` makes a new token (the old one stops working); ``revoke`` deletes it."""
    if action not in ("create", "revoke"):
        raise Http404("no such action")
    Token.objects.filter(user=request.user).delete()
    if action == "create":
        token = Token.objects.create(user=request.user)
        messages.success(request, _("New API token: %(key)s — the previous one no longer works.") % {"key": token.key})
    else:
        messages.info(request, _("API token revoked: requests with it are refused from now on."))
    return redirect("console-account")


class PasswordChangeView(auth_views.PasswordChangeView):
    template_name = "portal/password_change.html"
    success_url = reverse_lazy("console-account")

    def form_valid(self, form):
        messages.success(self.request, "Password changed.")
        return super().form_valid(form)


@login_required
@require_POST
def instance_clone(request, instance_id: int):
    instance = or_404(selectors.instance_get, user=request.user, instance_id=instance_id)
    try:
        clone = services.instance_clone(instance=instance, owner=request.user)
        messages.success(
            request,
            _("Instance %(clone)s created with the settings of %(name)s.")
            % {"clone": clone.name, "name": instance.name},
        )
    except ServiceError as exc:
        messages.error(request, exc.message)
    return redirect("console-instances")
