"""Create the key pairs the cloud signs with, each if it is missing.

- Celery messages (the ``auth`` serializer): every process that sends or runs tasks (web, scheduler worker
  and beat, node agents) signs with ``celery.key`` and verifies against the certificates in the store, so a
  message written into Redis by anyone else is refused.
- Relay tickets: ``relay.key`` (Ed25519) stays on the control plane (web servers, scheduler worker), which
  signs them; ``relay.pub`` goes to every GPU host, whose relay checks them. A host cannot make a ticket.

``make run`` and ``make test`` run this; production copies the files to the hosts that need them (README).
"""

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from cryptography.x509.oid import NameOID
from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the keys that sign Celery messages and relay tickets (each kept if it exists)."

    def handle(self, *args, **options):
        self._celery()
        self._relay()

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

    def _celery(self):
        key_path, cert_path = Path(settings.CELERY_SECURITY_KEY), Path(settings.CELERY_SECURITY_CERTIFICATE)
        if key_path.exists() and cert_path.exists():
            self.stdout.write(f"signing keys present: {key_path}, {cert_path}")
            return
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpucloud {settings.DEPLOYMENT_ID}")])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .sign(key, hashes.SHA256())
        )
        _private_write(key_path, key)
        cert_path.parent.mkdir(parents=True, exist_ok=True)
        cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        self.stdout.write(f"created signing keys: {key_path}, {cert_path}")


def _private_write(path: Path, key) -> None:
    """``key`` to ``path`` (PEM, PKCS 8), readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
