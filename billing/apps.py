"""App config for billing."""

from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"
    verbose_name = "Billing"

    def ready(self):
        from billing import receivers  # noqa: F401  (connects signal receivers)
