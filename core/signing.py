"""Who signed a Celery message: the control plane, or one GPU host with its own key.

Every process signs its messages with Celery's ``auth`` serializer. The control plane (web, scheduler worker and
beat) holds one key pair; each GPU host holds its own (``make_signing_keys --host NAME``), whose certificate
names it (``CN=gpucloud-host NAME``). What each side trusts is its certificate store: the control plane's holds
its own certificate and every host's; a host's holds its own and the control plane's only — so a host can neither
send a task to another host nor have a message of its own taken for the control plane's.

A message a host signed carries the host's name to its task (``sent_by``). Of the control plane's tasks a host
may send only those of ``core.messages.HOST_MAY_SEND`` (others are refused, logged, never run), and the replies
about an operation (a saved image, a grown disk, a move) are taken only from the host the operation was sent to.
"""

from __future__ import annotations

import contextvars
import glob
import logging
import os
import threading
import time

from celery import Task
from celery.exceptions import SecurityError
from celery.security.certificate import Certificate, FSCertStore
from celery.security.key import PrivateKey
from celery.security.serialization import SecureSerializer
from celery.security.utils import reraise_errors
from cryptography.x509.oid import NameOID
from kombu.serialization import loads, registry
from kombu.utils.encoding import bytes_to_str

log = logging.getLogger(__name__)
HOST_NAME_PREFIX = "gpucloud-host "  # a host's certificate's common name: this, then the host's name
SENT_BY = "__sent_by"  # the keyword a host-signed task message is given, taken off before the task runs
_sender: contextvars.ContextVar[str | None] = contextvars.ContextVar("sender", default=None)


def common_name(certificate) -> str:
    """The common name an X.509 certificate (``cryptography``'s) names; "" for none."""
    names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return names[0].value if names else ""


def host_of(certificate) -> str | None:
    """The host a certificate (Celery's ``Certificate``) names; None for the control plane's."""
    name = common_name(certificate._cert)
    return name.removeprefix(HOST_NAME_PREFIX) if name.startswith(HOST_NAME_PREFIX) else None


def sent_by() -> str | None:
    """The host that signed the message of the task running now; None: the control plane (or no message)."""
    return _sender.get()


class SenderSerializer(SecureSerializer):
    """Celery's signed serializer, telling a task message which host signed it (in its keyword arguments)."""

    def deserialize(self, data):
        """Celery's check (the signature against the store's certificate of its signer), then the body, keeping
        the signer: a task message a host signed gets its name."""
        with reraise_errors("Unable to deserialize: {0!r}", (Exception,)):
            payload = self._unpack(data)
            signer = self._cert_store[payload["signer"]]
            signer.verify(payload["body"], payload["signature"], self._digest)
        body = loads(payload["body"], payload["content_type"], payload["content_encoding"], force=True)
        host = host_of(signer)
        if host is not None:
            # Task protocol 2, (args, kwargs, embed), is all a host sends: anything else (protocol 1's dict, which
            # Celery still runs) could not carry the host's name to its task, and would pass for the control plane's.
            if not (isinstance(body, list | tuple) and len(body) == 3 and isinstance(body[1], dict)):
                raise SecurityError(f"host {host} signed a message that is not a task call (protocol 2)")
            body[1][SENT_BY] = host
        return body


class HostCertStore(FSCertStore):
    """Celery's store of the certificates in ``path`` (a glob), read again when a message names a signer it does
    not hold (at most once a second): a host whose certificate is put in the control plane's store
    (``make_signing_keys --host``) is heard without a restart. Taking one out needs the processes restarted."""

    RELOAD_S = 1.0

    def __init__(self, path: str):
        super().__init__(path)
        self._path = os.path.join(path, "*") if os.path.isdir(path) else path
        self._read_at, self._lock = time.monotonic(), threading.Lock()

    def __getitem__(self, id):
        try:
            return super().__getitem__(id)
        except SecurityError:
            with self._lock:
                if time.monotonic() - self._read_at >= self.RELOAD_S:
                    self._read_at = time.monotonic()
                    self._read_new()
            return super().__getitem__(id)

    def _read_new(self) -> None:
        for path in glob.glob(self._path):
            with open(path) as file:
                certificate = Certificate(file.read())
            if bytes_to_str(certificate.get_id()) not in self._certs and not certificate.has_expired():
                self.add_cert(certificate)


def register(app) -> None:
    """Put ``SenderSerializer`` in place of Celery's ``auth`` serializer, with the same key, certificate and store
    (call after ``app.setup_security()``, which checks the settings and turns the other serializers off)."""
    conf = app.conf
    with open(conf.security_key) as key, open(conf.security_certificate) as certificate:
        serializer = SenderSerializer(
            PrivateKey(key.read(), password=conf.security_key_password),
            Certificate(certificate.read()),
            HostCertStore(conf.security_cert_store),
            conf.security_digest,
        )
    registry.register(
        "auth", serializer.serialize, serializer.deserialize, content_type="application/data", content_encoding="utf-8"
    )


class SenderTask(Task):
    """Every task of the cloud: takes the signer's name off a host-signed message, and refuses a control-plane
    task that no host may send. A host's own tasks (``agent.``) run when a host signed them: only that host trusts
    its key (the control plane never runs them)."""

    def __call__(self, *args, **kwargs):
        host = kwargs.pop(SENT_BY, None)
        if host is not None and not self._host_may_send():
            log.warning("refused %s from host %s: hosts may not send it", self.name, host)
            return None
        token = _sender.set(host)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            _sender.reset(token)

    def _host_may_send(self) -> bool:
        from core.messages import HOST_MAY_SEND

        return self.name in HOST_MAY_SEND or self.name.startswith("agent.")
