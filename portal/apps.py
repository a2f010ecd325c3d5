"""App config for the portal."""

from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = "Portal"

    def ready(self):
        from portal import receivers  # noqa: F401  (connects signal receivers)
