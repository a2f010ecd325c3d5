"""Self-signed certificates, for keys whose certificate only carries the key and a name (what is trusted is the
certificate itself: a pinned fingerprint, a certificate store)."""

from __future__ import annotations

import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import NameOID


def self_signed(key, common_name: str, *, days: int = 3650) -> x509.Certificate:
    """A certificate of ``key`` (a private key) naming ``common_name``, signed by itself, valid ``days`` from
    yesterday (a clock a little behind still takes it)."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])])
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .sign(key, hashes.SHA256())
    )
