"""App config for the scheduler."""

from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    name = "scheduler"
    verbose_name = "Scheduler"

    def ready(self):
        from scheduler import receivers  # noqa: F401  (connects signal receivers)
