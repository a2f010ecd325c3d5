"""The platform's image registry (``settings.REGISTRY``): image names in it, its credentials, its HTTP API.

Docker engines push and pull through their own client, given the credentials by
``agent.launcher``; the control plane talks to the registry's HTTP API (v2)
only to ask whether an image is there and to delete one, from a worker task, never
from a web request. Tenants never see the registry's credentials: they name images by catalog id,
and the portal decides which ones they may use. With token authentication (``REGISTRY_TOKEN_REALM``)
each host logs in as itself and the web tier's token server (``portal.services.registry_tokens``)
grants what it may do (the token server signs them here: ``token_signed``). Without it,
every host and the control plane share the registry's one user (REGISTRY_USERNAME / REGISTRY_PASSWORD).
"""

from __future__ import annotations

import base64
import functools
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import jwt
import requests
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from django.conf import settings

from core.errors import ServiceError

# Whatever an engine pushed: Docker's schema 2, OCI, and their multi-platform lists. Without these
# the registry would describe another representation than the one stored, with another digest.
MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
    ]
)
TIMEOUT_S = 30


class RegistryError(ServiceError):
    """The registry could not be reached or refused: the message names the image, the registry and why."""


@dataclass(frozen=True)
class ImageName:
    registry: str  # host[:port]; "" for a name that names no registry
    repository: str
    tag: str

    @property
    def path(self) -> str:
        """The repository as an engine names it (with its registry), without the tag."""
        return f"{self.registry}/{self.repository}" if self.registry else self.repository

    def __str__(self) -> str:
        return f"{self.path}:{self.tag}"


def image_name(ref: str) -> ImageName:
    """Split a Docker reference as Docker does: the first component names a registry if it has a dot or a port."""
    first, slash, rest = ref.partition("/")
    registry = ""
    if slash and ("." in first or ":" in first or first == "localhost"):
        registry, ref = first, rest
    repository, tag = ref, "latest"
    if ":" in ref.rsplit("/", 1)[-1]:
        repository, _, tag = ref.rpartition(":")
    return ImageName(registry, repository, tag)


def registry_ref(name: str) -> str:
    """Image ``name`` (repository:tag) in the platform's registry; unchanged when there is none."""
    return f"{settings.REGISTRY}/{name}" if settings.REGISTRY else name


def credentials(registry: str) -> dict | None:
    """The docker SDK's ``auth_config`` for ``registry``: the platform's user for its own registry, none elsewhere."""
    if registry and registry == settings.REGISTRY and settings.REGISTRY_USERNAME:
        return {"username": settings.REGISTRY_USERNAME, "password": settings.REGISTRY_PASSWORD}
    return None


def manifest_digest(name: ImageName) -> str | None:
    """The digest of the manifest tagged ``name`` in its registry; None when the registry has no such tag."""
    response = _request("HEAD", name, f"manifests/{name.tag}", headers={"Accept": MANIFEST_TYPES})
    if response.status_code == 404:
        return None
    _check(response, name)
    return response.headers["Docker-Content-Digest"]


def manifest_delete(name: ImageName) -> bool:
    """Delete the image tagged ``name`` from its registry; False when it was not there.

    The registry deletes by digest (every tag of that manifest in the repository goes:
    each saved image has a manifest of its own). The layers stay on the registry's disk
    until its garbage collector runs (``docker-registry garbage-collect``).
    """
    digest = manifest_digest(name)
    if digest is None:
        return False
    response = _request("DELETE", name, f"manifests/{digest}")
    if response.status_code == 404:
        return False
    _check(response, name)
    return True


def token_signed(subject: str, access: list[dict], *, now: float | None = None) -> dict:
    """Distribution's token document granting ``subject`` the ``access`` entries ({type, name, actions}): a JWT
    (RS256) signed with the control plane's key, its certificate in the header (``x5c``: the registry checks it
    against the certificate it trusts, ``rootcertbundle``)."""
    now = int(now or time.time())
    ttl = settings.REGISTRY_TOKEN_TTL_S
    claims = {
        "iss": settings.REGISTRY_TOKEN_ISSUER,
        "sub": subject,
        "aud": settings.REGISTRY_TOKEN_SERVICE,
        "exp": now + ttl,
        "nbf": now - 1,
        "iat": now,
        "jti": secrets.token_hex(16),
        "access": access,
    }
    key, chain = _token_key()
    token = jwt.encode(claims, key, algorithm="RS256", headers={"x5c": chain})
    issued = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    return {"token": token, "access_token": token, "expires_in": ttl, "issued_at": issued}


def _token_key() -> tuple[object, list[str]]:
    key_path, cert_path = Path(settings.REGISTRY_TOKEN_KEY), Path(settings.REGISTRY_TOKEN_CERTIFICATE)
    try:
        return _key_load(str(key_path), str(cert_path), key_path.stat().st_mtime_ns, cert_path.stat().st_mtime_ns)
    except FileNotFoundError as exc:
        raise RegistryError(f"no registry token key: {exc.filename} (python manage.py make_signing_keys)") from exc


@functools.lru_cache(maxsize=2)
def _key_load(key_path: str, cert_path: str, *_mtimes: int) -> tuple[object, list[str]]:
    """The signing key and its certificate chain as ``x5c`` wants it (DER, base64)."""
    key = serialization.load_pem_private_key(Path(key_path).read_bytes(), password=None)
    certificate = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    return key, [base64.b64encode(certificate.public_bytes(serialization.Encoding.DER)).decode()]


def _request(method: str, name: ImageName, path: str, **kwargs) -> requests.Response:
    """One call to the registry's API with this process's login: basic credentials, or — where the registry asks for
    a bearer token (token mode) — the token its realm grants that login for the scope the registry names."""
    if not name.registry:
        raise RegistryError(f"image {name} names no registry")
    scheme = "https" if settings.REGISTRY_CA_FILE else "http"
    given = credentials(name.registry)
    auth = (given["username"], given["password"]) if given else None
    url = f"{scheme}://{name.registry}/v2/{name.repository}/{path}"
    verify = settings.REGISTRY_CA_FILE or True
    try:
        response = requests.request(method, url, auth=auth, verify=verify, timeout=TIMEOUT_S, **kwargs)
        challenge = response.headers.get("WWW-Authenticate", "")
        if response.status_code != 401 or not challenge.lower().startswith("bearer "):
            return response
        token = _bearer_token(dict(_CHALLENGE_PARAM.findall(challenge)), auth, verify)
        if token is None:
            return response
        headers = kwargs.pop("headers", {}) | {"Authorization": f"Bearer {token}"}
        return requests.request(method, url, headers=headers, verify=verify, timeout=TIMEOUT_S, **kwargs)
    except requests.RequestException as exc:
        raise RegistryError(f"the registry {name.registry} cannot be reached: {_first_line(exc)}") from exc


_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


def _bearer_token(challenge: dict, auth, verify) -> str | None:
    """The token the challenge's realm grants ``auth`` for its service and scope (None: refused)."""
    params = {key: challenge[key] for key in ("service", "scope") if key in challenge}
    response = requests.get(challenge.get("realm", ""), params=params, auth=auth, verify=verify, timeout=TIMEOUT_S)
    if response.status_code != 200:
        return None
    answer = response.json()
    return answer.get("token") or answer.get("access_token")


def _check(response: requests.Response, name: ImageName) -> None:
    if response.ok:
        return
    if response.status_code == 401:
        why = "it refused the platform's credentials (REGISTRY_USERNAME / REGISTRY_PASSWORD)"
    elif response.status_code == 405:
        why = "it does not allow deletes (storage.delete.enabled in its configuration)"
    else:
        why = f"it answered {response.status_code} {response.text[:200]}".strip()
    raise RegistryError(f"registry {name.registry}, image {name}: {why}")


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
