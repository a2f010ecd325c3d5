"""The platform's image registry (``settings.REGISTRY``): image names in it, its credentials, its HTTP API.

Docker engines push and pull through their own client, given the credentials by
``agent.launcher``; the control plane talks to the registry's HTTP API (v2)
only to ask whether an image is there and to delete one, from a worker task, never
from a web request. Every host and the control plane share one registry user
(REGISTRY_USERNAME / REGISTRY_PASSWORD); tenants never see it: they name images by
catalog id, and the portal decides which ones they may use.
"""

from __future__ import annotations

from dataclasses import dataclass

import requests
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


def _request(method: str, name: ImageName, path: str, **kwargs) -> requests.Response:
    if not name.registry:
        raise RegistryError(f"image {name} names no registry")
    scheme = "https" if settings.REGISTRY_CA_FILE else "http"
    auth = credentials(name.registry)
    try:
        return requests.request(
            method,
            f"{scheme}://{name.registry}/v2/{name.repository}/{path}",
            auth=(auth["username"], auth["password"]) if auth else None,
            verify=settings.REGISTRY_CA_FILE or True,
            timeout=TIMEOUT_S,
            **kwargs,
        )
    except requests.RequestException as exc:
        raise RegistryError(f"the registry {name.registry} cannot be reached: {_first_line(exc)}") from exc


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
