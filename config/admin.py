"""The admin site: Django's, with its sign-in form under the same attempt limit as the console's."""

from django.contrib import admin
from django.http import HttpResponse
from django.utils.translation import gettext as _

from portal.throttles import sign_in_wait


class AdminSite(admin.AdminSite):
    def login(self, request, extra_context=None):
        wait = sign_in_wait(request) if request.method == "POST" else None
        if wait is not None:
            message = _("Too many sign-in attempts: try again in %(wait)s s.") % {"wait": wait}
            response = HttpResponse(message, status=429, content_type="text/plain; charset=utf-8")
            response["Retry-After"] = str(wait)
            return response
        return super().login(request, extra_context)
