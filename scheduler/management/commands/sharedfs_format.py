"""Format the users' shared file storage (JuiceFS) once, and give every user its directory with its quota.

Run it on the control plane before the node agents start (``make run``, the
several-host script and docker-compose do); running it again changes nothing
but the directories of users who have none yet.
"""

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from core.errors import ServiceError
from scheduler import sharedfs


class Command(BaseCommand):
    help = "Format the shared file storage volume (idempotent) and create each user's directory with its quota."

    def handle(self, *args, **options):
        if not sharedfs.enabled():
            raise CommandError("the shared storage is off: set SHARED_FS_META to JuiceFS's metadata URL")
        try:
            made = sharedfs.volume_format()
            have = sharedfs.quotas()
            missing = get_user_model().objects.exclude(pk__in=have).values_list("pk", flat=True)
            for user_id in missing:
                sharedfs.quota_set(user_id, settings.SHARED_FS_QUOTA_GB)
        except ServiceError as exc:
            raise CommandError(exc.message) from exc
        where = sharedfs.redact(settings.SHARED_FS_META)
        state = "formatted" if made else "already formatted"
        self.stdout.write(
            f"shared storage: JuiceFS volume {settings.SHARED_FS_NAME} {state} (metadata {where}); "
            f"{len(missing)} users given their directory ({settings.SHARED_FS_QUOTA_GB:g} GiB each)"
        )
