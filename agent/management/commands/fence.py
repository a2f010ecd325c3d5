"""Is this GPU host's tenant network fenced? Run where the node agent runs (its network namespace).

    python manage.py fence            # "fence in place" or the reason it is not (exit status 1)
    python manage.py fence --install  # (re)install it first, as the agent does at start

Uses the agent's settings (INSTANCE_BRIDGE, INSTANCE_NETWORK, FENCE_EXTRA_CIDRS, DOCKER_BASE_URL).
"""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from agent.iptables import IptablesError
from agent.network import fence_install, fence_problem


class Command(BaseCommand):
    help = "Check (or --install) the tenant network fence on this host."

    def add_arguments(self, parser):
        parser.add_argument("--install", action="store_true", help="install it first, as the node agent does")

    def handle(self, *args, install, **options):
        if install:
            try:
                self.stdout.write(f"installed for {settings.INSTANCE_BRIDGE}: {', '.join(fence_install())}")
            except IptablesError as exc:
                raise CommandError(f"the fence could not be installed: {exc}") from exc
        problem = fence_problem()
        if problem:
            raise CommandError(f"the tenant network fence is not in place: {problem}")
        self.stdout.write(f"fence in place for {settings.INSTANCE_BRIDGE}")
