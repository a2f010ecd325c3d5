"""Bearer tokens for the image registry (Distribution's token authentication): who may pull and push what.

In token mode (``REGISTRY_TOKEN_REALM`` set; ``config/dev/registry.sh`` writes the registry's side), the registry
answers an engine that has no token with a challenge naming the realm, the web tier's ``/registry/token/``. The
engine asks there with its basic credentials and the scopes it needs (``repository:<name>:pull,push``) and gets a
JWT signed with the control plane's key (``make_signing_keys``: ``registry-token.key``; the registry trusts its
certificate) that grants what its caller may do, and nothing else:

- the control plane (``REGISTRY_USERNAME`` / ``REGISTRY_PASSWORD``): whatever it asks (it pushes the catalog's
  images, reads and deletes saved ones);
- a GPU host (``node-<name>`` with its own password: ``manage.py registry_host_user``): pull of the catalog's
  repositories (any host may start them), of a tenant's saved image only while work placed on that host runs from
  it, and of a move's snapshot only while it is that move's target (copying); push only to the repository of an
  image it is saving now (its ``Image`` row is saving on that host) or of the snapshot of a move it is the source
  of (copying); never delete. So a taken host can read no tenant's saved image that its own work does not use;
- anyone else: refused (401).

Each saved image and each move's snapshot has a repository of its own (``gpucloud-saved/u<owner>-i<id>``,
``gpucloud-move/m<id>``), so a push grant is one image: a taken host can overwrite no tenant's saved image. An
action not granted is left out of the token (the registry then refuses that request), as Distribution's token
specification has it.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Q

from core.errors import InvalidInput
from core.host_logins import password_sha256
from core.messages import is_node_name
from core.redis_acl import USER_PREFIX
from portal.models import Image, ImageStatus
from portal.services.images import REPOSITORY as SAVED_REPOSITORY
from scheduler import registry
from scheduler.models import Move, MoveStatus, RegistryCredential, Workload, WorkloadStatus
from scheduler.registry import image_name
from scheduler.services.moves import MOVE_REPOSITORY, move_snapshot_repository

# Distribution's repository name grammar (path components of lowercase alphanumerics and separators).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
REPOSITORY_NAME = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
ACTIONS = {"pull", "push", "delete", "*"}
SCOPES_MAX = 16


@dataclass(frozen=True)
class Caller:
    """Who asks for a token: the control plane, or the GPU host ``host``."""

    subject: str
    host: str = ""  # "" for the control plane


@dataclass(frozen=True)
class Scope:
    type: str
    name: str
    actions: tuple[str, ...]


def caller_of(username: str, password: str) -> Caller | None:
    """The caller these basic credentials name, or None (unknown, wrong password)."""
    control = settings.REGISTRY_USERNAME
    if control and username == control and not username.startswith(USER_PREFIX):  # never a host's name
        if settings.REGISTRY_PASSWORD and hmac.compare_digest(password.encode(), settings.REGISTRY_PASSWORD.encode()):
            return Caller(subject=username)
        return None
    host = username.removeprefix(USER_PREFIX)
    if not username.startswith(USER_PREFIX) or not is_node_name(host):
        return None
    stored = RegistryCredential.objects.filter(host=host).values_list("password_sha256", flat=True).first()
    if stored is None or not hmac.compare_digest(stored, password_sha256(password)):
        return None
    return Caller(subject=username, host=host)


def scopes_parse(texts: list[str]) -> list[Scope]:
    """The ``scope`` parameters (``repository:<name>:<action>[,<action>]``); InvalidInput naming the field."""
    if len(texts) > SCOPES_MAX:
        raise InvalidInput(f"at most {SCOPES_MAX} scopes in one request", field="scope")
    scopes = []
    for text in texts:
        kind, _, rest = text.partition(":")
        name, _, actions = rest.rpartition(":")
        wanted = tuple(a for a in actions.split(",") if a)
        if kind == "registry" and name == "catalog":
            scopes.append(Scope(kind, name, wanted))  # the registry's list of repositories: nobody's, below
            continue
        if kind != "repository" or not REPOSITORY_NAME.fullmatch(name) or not wanted or set(wanted) - ACTIONS:
            raise InvalidInput(f"repository:<name>:<pull|push|delete|*>[,...], not {text[:200]!r}", field="scope")
        scopes.append(Scope(kind, name, wanted))
    return scopes


def granted(caller: Caller, scope: Scope) -> tuple[str, ...]:
    """The actions of ``scope`` that ``caller`` may do."""
    if not caller.host:
        return scope.actions if scope.type == "repository" else ()
    if scope.type != "repository":
        return ()
    allowed = set()
    if "push" in scope.actions and scope.name in pushing(caller.host):
        allowed |= {"push", "pull"}
    elif not private(scope.name) or ("pull" in scope.actions and scope.name in pulling(caller.host)):
        allowed.add("pull")
    return tuple(action for action in scope.actions if action in allowed)


def private(repository: str) -> bool:
    """A tenant's saved image or a move's snapshot: not the catalog's."""
    return repository.startswith((f"{SAVED_REPOSITORY}/", f"{MOVE_REPOSITORY}/"))


def pulling(host: str) -> set[str]:
    """The private repositories host ``host`` may pull now: the saved images its work runs from (single-node work
    placed on it, a gang's members there; not yet released), the snapshots of moves to it (copying)."""
    ended = [WorkloadStatus.RELEASED, WorkloadStatus.FAILED, WorkloadStatus.SUCCEEDED]
    placed = Workload.objects.filter(Q(node__name=host) | Q(members__node__name=host)).exclude(status__in=ended)
    names = {image_name(ref).repository for ref in placed.values_list("image_ref", flat=True) if ref}
    return names | _snapshots(Move.objects.filter(status=MoveStatus.COPYING, target__name=host))


def pushing(host: str) -> set[str]:
    """The repositories host ``host`` may push to now: the images it is saving, its moves' snapshots."""
    saving = Image.objects.filter(status=ImageStatus.SAVING, node__name=host).values_list("docker_ref", flat=True)
    names = {image_name(ref).repository for ref in saving if ref}
    return names | _snapshots(Move.objects.filter(status=MoveStatus.COPYING, source__name=host))


def _snapshots(moves) -> set[str]:
    """The snapshot repositories of ``moves`` (a queryset)."""
    return {move_snapshot_repository(pk) for pk in moves.values_list("pk", flat=True)}


def token_for(caller: Caller, scopes: list[Scope], *, now: float | None = None) -> dict:
    """The token endpoint's answer: a JWT granting ``caller`` what it may do of ``scopes``."""
    access = []
    for scope in scopes:
        actions = granted(caller, scope)
        if actions:
            access.append({"type": scope.type, "name": scope.name, "actions": list(actions)})
    return registry.token_signed(caller.subject, access, now=now)
