"""Create the key pair that signs Celery messages (the ``auth`` serializer), if it is missing.

Every process that sends or runs tasks (web, scheduler worker and beat, node agents)
signs with the private key and verifies against the certificates in the store, so
a message written into Redis by anyone else is refused. ``make run`` and ``make test``
run this; production copies the same files to every trusted host (README).
"""

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the private key and certificate that sign Celery messages (kept if they exist)."

    def handle(self, *args, **options):
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
        key_path.parent.mkdir(parents=True, exist_ok=True)
        cert_path.parent.mkdir(parents=True, exist_ok=True)
        key_path.touch(mode=0o600)
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        self.stdout.write(f"created signing keys: {key_path}, {cert_path}")
