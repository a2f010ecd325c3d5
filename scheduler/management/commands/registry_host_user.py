"""Give a GPU host its own registry login (``portal.services.registry_tokens``): ``node-<name>``.

    python manage.py registry_host_user --host gpu1 --password-file /run/secrets/gpu1-registry
    printf %s "$PASSWORD" | python manage.py registry_host_user --host gpu1 --password-file -
    python manage.py registry_host_user --host gpu1 --remove

Run on the control plane. Only the password's SHA-256 is kept (in a table no host's database role reads). The
host's agent then logs in to the registry with ``REGISTRY_USERNAME=node-gpu1`` and that password: the token server
lets it pull the catalog and the saved images its work runs from, and push only the image it is saving or its
move's snapshot. It takes effect where the registry uses tokens (``REGISTRY_TOKEN_REALM``).
"""

from core.host_logins import HostLoginCommand
from core.redis_acl import username
from scheduler.models import RegistryCredential


class Command(HostLoginCommand):
    help = (
        "Create (or replace, or --remove) a GPU host's own registry login: pull the catalog and what its work runs, "
        "push its own saves."
    )
    service = "registry"
    remove_help = "delete the host's login (its tokens expire)"

    def login_remove(self, host: str) -> None:
        RegistryCredential.objects.filter(host=host).delete()
        self.stdout.write(f"registry login {username(host)} removed")

    def login_set(self, host: str, sha256: str) -> None:
        RegistryCredential.objects.update_or_create(host=host, defaults={"password_sha256": sha256})
        self.stdout.write(
            f"registry login {username(host)}: pulls the catalog and what its work runs, pushes only what it saves"
        )
