"""App configs of the project itself: the admin, on config.admin.AdminSite."""

from django.contrib.admin.apps import AdminConfig as DjangoAdminConfig


class AdminConfig(DjangoAdminConfig):
    default_site = "config.admin.AdminSite"
