"""The account page: API tokens (create with a name, revoke) and password; and cloning an instance from the list."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse_lazy
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST, require_safe

from core.errors import ServiceError
from portal import selectors
from portal.console.shortcuts import or_404
from portal.services import tokens, work


@login_required
@require_safe
def account_page(request):
    context = {"tokens": tokens.token_list(user=request.user), "token_days": settings.API_TOKEN_DAYS}
    return render(request, "portal/account.html", context)


@login_required
@require_POST
def account_token(request, action: str):
    """``create`` makes a named token (its key shown once); ``revoke`` deletes the one named by ``token``."""
    if action == "create":
        try:
            token, key = tokens.token_create(user=request.user, name=request.POST.get("name") or _("console"))
        except ServiceError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(
                request,
                _("New API token %(name)s: %(key)s — copy it now, it is not shown again.")
                % {"name": token.name, "key": key},
            )
    elif action == "revoke":
        token_id = request.POST.get("token", "")
        if token_id.isdigit() and tokens.token_revoke(user=request.user, token_id=int(token_id)):
            messages.info(request, _("API token revoked: requests with it are refused from now on."))
        else:
            messages.error(request, _("No such token."))
    else:
        raise Http404("no such action")
    return redirect("console-account")


class PasswordChangeView(auth_views.PasswordChangeView):
    template_name = "portal/password_change.html"
    http_method_names = ["get", "head", "post", "options"]  # not FormView's PUT, another way to post
    success_url = reverse_lazy("console-account")

    def form_valid(self, form):
        # Saving the new password revokes the API tokens (portal.receivers); the session stays signed in.
        messages.success(self.request, _("Password changed: your API tokens were revoked."))
        return super().form_valid(form)


@login_required
@require_POST
def instance_clone(request, instance_id: int):
    instance = or_404(selectors.instance_get_owned, user=request.user, instance_id=instance_id)  # as the API's
    try:
        clone = work.instance_clone(instance=instance, owner=request.user)
        messages.success(
            request,
            _("Instance %(clone)s created with the settings of %(name)s.")
            % {"clone": clone.name, "name": instance.name},
        )
    except ServiceError as exc:
        messages.error(request, exc.message)
    return redirect("console-instances")
