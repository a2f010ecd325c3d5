"""Top-level URLs: console, API, API docs, admin, login."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.decorators.cache import cache_control
from django.views.i18n import JavaScriptCatalog
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from portal.api import metrics, registry_token
from portal.console import work

urlpatterns = [
    path("healthz/", work.healthz, name="healthz"),
    path("metrics", metrics.metrics, name="metrics"),  # Prometheus's default path
    path("registry/token/", registry_token.registry_token, name="registry-token"),  # the registry's token server
    path("", include("portal.console.urls")),
    path("login/", work.ThrottledLoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("i18n/", include("django.conf.urls.i18n")),  # set_language: the language switch
    # The live pages' strings (gettext() in static/js), per language; cached a day in the browser.
    path("jsi18n/", cache_control(max_age=86400)(JavaScriptCatalog.as_view()), name="javascript-catalog"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("portal.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]
