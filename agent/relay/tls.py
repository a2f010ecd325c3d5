"""The relay's TLS: a key and a self-signed certificate of the host's own, made once and kept.

Kept together in ``AGENT_STATE_DIR/<node>/relay-tls.pem`` (the key, then the certificate; mode 600), so a
restart serves the same certificate. What callers check is its SHA-256, which the agent registers with its
relay URL (``core.relay_tls``), not a chain to a certificate authority: the names in it do not matter.
Remove the file to re-key; the next start registers the new certificate.
"""

from __future__ import annotations

import hashlib
import os
import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from core.certificates import self_signed

FILE = "relay-tls.pem"


def relay_tls(folder: Path, node: str) -> tuple[ssl.SSLContext, str]:
    """(the server's TLS context, the certificate's SHA-256 in hex) for node ``node``'s relay."""
    path = folder / FILE
    if not path.exists():
        _make(path, node)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(path)
    der = x509.load_pem_x509_certificate(path.read_bytes()).public_bytes(serialization.Encoding.DER)
    return context, hashlib.sha256(der).hexdigest()


def _make(path: Path, node: str) -> None:
    """Write a new key and certificate at ``path``, unless another process got there first (theirs is kept)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = self_signed(key, f"gpucloud relay {node}")  # ten years: a re-key is a file removed
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ) + cert.public_bytes(serialization.Encoding.PEM)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=".relay-tls-")  # mode 600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(pem)
        try:
            os.link(partial, path)  # whole, and never over one already there
        except FileExistsError:
            pass
    finally:
        os.unlink(partial)
