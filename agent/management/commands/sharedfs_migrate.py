"""Copy the shared storage this host kept in Docker volumes (``/root/shared``) into the users' ``/root/autodl-fs``.

Before JuiceFS, each host kept a user's "shared" files in a Docker volume of its
own. Run this once on each GPU host (where the agent runs, with the same
settings): each such volume is copied into ``users/<id>/shared-from-<host>/``,
the copy is checked, and with ``--remove`` the volume is deleted. A volume still
used by an instance's container is kept (the container is recreated without it
at its next start; run this again then).
"""

import socket

import docker
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from agent.launcher import docker_client
from agent.sharedfs import legacy_migrate, legacy_volumes
from core.errors import ServiceError
from scheduler import sharedfs


class Command(BaseCommand):
    help = "Copy this host's legacy shared-storage Docker volumes into each user's shared file storage."

    def add_arguments(self, parser):
        parser.add_argument("--remove", action="store_true", help="delete each volume once its copy is checked")
        parser.add_argument("--host", default=settings.NODE_NAME or socket.gethostname().split(".")[0])

    def handle(self, *args, remove, host, **options):
        if not sharedfs.enabled():
            raise CommandError("the shared storage is off: set SHARED_FS_META to JuiceFS's metadata URL")
        failed = 0
        for owner_id, volume in sorted(legacy_volumes(docker_client()).items()):
            try:
                target, files, size = legacy_migrate(owner_id, volume, host=host, remove=remove)
            except ServiceError as exc:
                failed += 1
                self.stderr.write(f"{volume.name}: {exc.message}")
                continue
            except docker.errors.APIError as exc:  # removal refused: a container still uses it
                self.stderr.write(f"{volume.name}: copied, kept ({exc.explanation})")
                continue
            kept = "removed" if remove else "kept"
            self.stdout.write(f"{volume.name}: {files} files, {size} bytes -> {target} (volume {kept})")
        if failed:
            raise CommandError(f"{failed} volumes were not copied (see above)")
