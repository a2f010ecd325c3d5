"""Calling a host's relay over TLS, accepting only the certificate the host registered.

A host's agent makes its relay's key and a self-signed certificate once (``agent.relay.tls``) and registers
the certificate's SHA-256 beside its relay URL (``Node.relay_tls_sha256``), through its own database role,
over TLS. Callers (the web tier; a moving instance's target host) accept that certificate and no other: no
certificate authority to run, and nobody on the LAN can stand in for a relay or read a terminal, a file or a
data disk on the wire (they cannot write the node's row). A host can only re-key its own relay.

A relay URL ``https://`` with no fingerprint, or ``http://`` with one, is refused where it is checked
(``core.relay.relay_base``).
"""

from __future__ import annotations

import requests
from requests.adapters import HTTPAdapter


class _Pinned(HTTPAdapter):
    """HTTPS that takes the one certificate whose SHA-256 is ``sha256`` (urllib3's ``assert_fingerprint``)."""

    def __init__(self, sha256: str):
        self._sha256 = sha256
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["assert_fingerprint"] = self._sha256
        super().init_poolmanager(*args, **kwargs)

    def send(self, request, **kwargs):
        # No chain to a CA is checked, the fingerprint is, on every connection. Set here, not on the session:
        # requests replaces a session's verify=False with REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE when they are set.
        kwargs["verify"] = False
        return super().send(request, **kwargs)


def relay_http(tls_sha256: str) -> requests.Session:
    """A session for calling one relay: over TLS pinned to ``tls_sha256`` (its registered certificate), or
    plain HTTP when it registered none. A certificate other than the pinned one fails the call
    (``requests.exceptions.SSLError``, a ``RequestException``)."""
    session = requests.Session()
    if tls_sha256:
        session.mount("https://", _Pinned(tls_sha256))
    return session


def wrong_certificate(exc: Exception) -> bool:
    """Whether a failed relay call met a certificate other than the registered one."""
    return isinstance(exc, requests.exceptions.SSLError) and "Fingerprints did not match" in str(exc)  # urllib3's
