"""Give a GPU host its own registry login (``portal.services.registry_tokens``): ``node-<name>``.

    python manage.py registry_host_user --host gpu1 --password-file /run/secrets/gpu1-registry
    printf %s "$PASSWORD" | python manage.py registry_host_user --host gpu1 --password-file -
    python manage.py registry_host_user --host gpu1 --remove

Run on the control plane. Only the password's SHA-256 is kept (in a table no host's database role reads). The
host's agent then logs in to the registry with ``REGISTRY_USERNAME=node-gpu1`` and that password: the token server
lets it pull any image and push only the image it is saving or its move's snapshot. It takes effect where the
registry uses tokens (``REGISTRY_TOKEN_REALM``).
"""

from django.core.management.base import BaseCommand, CommandError

from core.messages import is_node_name
from core.password_files import first_line
from core.redis_acl import username
from portal.services.registry_tokens import password_sha256
from scheduler.models import RegistryCredential


class Command(BaseCommand):
    help = "Create (or replace, or --remove) a GPU host's own registry login: pull anything, push its own saves."

    def add_arguments(self, parser):
        parser.add_argument("--host", required=True, help="the node's name")
        parser.add_argument(
            "--password-file", help="a file holding the host's registry password (first line); - reads it from stdin"
        )
        parser.add_argument("--remove", action="store_true", help="delete the host's login (its tokens expire)")

    def handle(self, *args, host, password_file, remove, **options):
        if not is_node_name(host):
            raise CommandError(f"--host: '{host}' is not a node name (letters, digits, '-' and '_')")
        if remove:
            RegistryCredential.objects.filter(host=host).delete()
            self.stdout.write(f"registry login {username(host)} removed")
            return
        if not password_file:
            raise CommandError("--password-file: name the file holding the host's registry password")
        password = first_line(password_file)
        if len(password) < 16:
            raise CommandError(f"--password-file: {password_file} holds no password of 16 characters or more")
        RegistryCredential.objects.update_or_create(host=host, defaults={"password_sha256": password_sha256(password)})
        self.stdout.write(f"registry login {username(host)}: pulls any image, pushes only what it saves")
