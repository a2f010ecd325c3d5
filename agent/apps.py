"""App config for the GPU host's package: installed for its management commands; it has no models."""

from django.apps import AppConfig


class AgentConfig(AppConfig):
    name = "agent"
    verbose_name = "GPU host agent"
