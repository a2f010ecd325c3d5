"""Create the key pairs the cloud signs with, each if it is missing.

- Celery messages (the ``auth`` serializer): every process that sends or runs tasks (web, scheduler worker
  and beat, node agents) signs with ``celery.key`` and verifies against the certificates in the store, so a
  message written into Redis by anyone else is refused. The control plane has one pair; ``--host NAME --into
  DIR`` makes a GPU host's own pair in its keys folder ``DIR`` (with the control plane's certificate and
  ``relay.pub``), and puts the host's certificate in the control plane's store (``core.signing``).
- Relay tickets: ``relay.key`` (Ed25519) stays on the control plane (web servers, scheduler worker), which
  signs them; ``relay.pub`` goes to every GPU host, whose relay checks them. A host cannot make a ticket.
- Registry tokens: ``registry-token.key`` (RSA) stays on the control plane, which signs the registry's bearer
  tokens with it; the registry trusts ``registry-token.pem`` (``portal.services.registry_tokens``).

``make run`` and ``make test`` run this; production copies the files to the hosts that need them (README).
"""

import shutil
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from core import signing
from core.certificates import self_signed
from core.messages import is_node_name


class Command(BaseCommand):
    help = "Create the keys that sign Celery messages, relay tickets and registry tokens (each kept if it exists)."

    def add_arguments(self, parser):
        parser.add_argument("--host", help="make this GPU host's own signing pair (its certificate names it)")
        parser.add_argument("--into", help="the host's keys folder (with --host): never the control plane's")

    def handle(self, *args, **options):
        self._celery()
        self._relay()
        self._registry()
        if options["host"] or options["into"]:
            if not (options["host"] and options["into"]):
                raise CommandError("--host and --into go together: the host's name and its keys folder")
            self._host(options["host"], Path(options["into"]))

    def _host(self, name: str, folder: Path):
        """Host ``name``'s keys folder: its own Celery pair (``celery.key``, ``certs/celery.pem``), the control
        plane's certificate (``certs/control-plane.pem``: the only other one it trusts) and ``relay.pub``; its
        certificate goes into the control plane's store as ``host-<name>.pem``."""
        if not is_node_name(name):
            raise CommandError(f"--host: {name!r} is not a node name (letters, digits, '-', '_'; at most 63)")
        ours = Path(settings.CELERY_SECURITY_CERTIFICATE).parent
        if folder.resolve() == Path(settings.KEYS_DIR).resolve():
            raise CommandError("--into: that is the control plane's keys folder; give the host's own")
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        key_path, cert_path = folder / "celery.key", folder / "certs" / "celery.pem"
        own = f"{signing.HOST_NAME_PREFIX}{name}"
        if key_path.exists() and cert_path.exists() and _named(cert_path) == own:
            self.stdout.write(f"host {name}'s signing keys present: {key_path}")
        else:  # none yet, or another's (the control plane's pair, as hosts were given before they had their own)
            _pair_write(key_path, cert_path, own)
            self.stdout.write(f"created host {name}'s signing keys: {key_path}, {cert_path}")
        for other in (folder / "certs").glob("*.pem"):
            if other.name != "celery.pem":
                other.unlink()  # it trusts no other host's certificate
        shutil.copyfile(settings.CELERY_SECURITY_CERTIFICATE, folder / "certs" / "control-plane.pem")
        shutil.copyfile(settings.RELAY_VERIFY_KEY, folder / "relay.pub")
        (folder / "relay.key").unlink(missing_ok=True)  # a host checks relay tickets, it never makes one
        shutil.copyfile(cert_path, ours / f"host-{name}.pem")
        self.stdout.write(f"the control plane trusts it: {ours / f'host-{name}.pem'}")

    def _relay(self):
        key_path, public_path = Path(settings.RELAY_SIGNING_KEY), Path(settings.RELAY_VERIFY_KEY)
        if key_path.exists() and public_path.exists():
            self.stdout.write(f"relay keys present: {key_path}, {public_path}")
            return
        if public_path.exists():  # a host's keys folder: it verifies, it never signs
            self.stdout.write(f"relay verify key present: {public_path} (no signing key here)")
            return
        key = ed25519.Ed25519PrivateKey.generate()
        _private_write(key_path, key)
        public_path.parent.mkdir(parents=True, exist_ok=True)
        public_path.write_bytes(
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        self.stdout.write(f"created relay keys: {key_path} (control plane only), {public_path} (every host)")

    def _registry(self):
        key_path, cert_path = Path(settings.REGISTRY_TOKEN_KEY), Path(settings.REGISTRY_TOKEN_CERTIFICATE)
        if key_path.exists() and cert_path.exists():
            self.stdout.write(f"registry token keys present: {key_path}, {cert_path}")
            return
        if Path(settings.RELAY_VERIFY_KEY).exists() and not Path(settings.RELAY_SIGNING_KEY).exists():
            return  # a host's keys folder: it asks for tokens, it never makes one
        _pair_write(key_path, cert_path, f"gpucloud {settings.DEPLOYMENT_ID} registry tokens")
        self.stdout.write(f"created registry token keys: {key_path} (control plane only), {cert_path} (the registry)")

    def _celery(self):
        key_path, cert_path = Path(settings.CELERY_SECURITY_KEY), Path(settings.CELERY_SECURITY_CERTIFICATE)
        if key_path.exists() and cert_path.exists():
            self.stdout.write(f"signing keys present: {key_path}, {cert_path}")
            return
        _pair_write(key_path, cert_path, f"gpucloud {settings.DEPLOYMENT_ID}")
        self.stdout.write(f"created signing keys: {key_path}, {cert_path}")


def _named(cert_path: Path) -> str:
    """The common name a PEM certificate file names."""
    return signing.common_name(x509.load_pem_x509_certificate(cert_path.read_bytes()))


def _pair_write(key_path: Path, cert_path: Path, common_name: str) -> None:
    """A new RSA key and its self-signed certificate naming ``common_name`` (ten years)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    certificate = self_signed(key, common_name)
    _private_write(key_path, key)
    cert_path.parent.mkdir(parents=True, exist_ok=True)
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


def _private_write(path: Path, key) -> None:
    """``key`` to ``path`` (PEM, PKCS 8), readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
