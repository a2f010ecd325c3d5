"""The registry in token mode (issue 31 §1): each host logs in as itself; the web tier's token server lets it pull
the catalog and the saved images its own work runs from, and push only the image it is saving (or its move's
snapshot); the control plane does anything.

A real registry (Debian's docker-registry, ``config/dev/registry.sh`` in token mode) trusts the certificate of the
control plane's token key; the root Docker engine pushes and pulls with a host's credentials and does the token
exchange itself against the token server (pytest-django's live server, on loopback).
"""

import io
from contextlib import suppress

import docker
import jwt
import pytest
import requests
from django.conf import settings
from django.core.management import call_command

from agent.launcher import docker_client
from portal.models import Image
from scheduler.registry import image_name, manifest_delete, manifest_digest
from tests.conftest import make_node
from tests.portal.test_registry import PASSWORD, USERNAME, RegistryServer

pytestmark = pytest.mark.django_db(transaction=True)
HOST_PASSWORD = "host-registry-password-0123456789"


@pytest.fixture(scope="module")
def token_registry(tmp_path_factory, live_server):
    call_command("make_signing_keys", stdout=io.StringIO())
    env = {
        "REGISTRY_TOKEN_REALM": f"{live_server.url}/registry/token/",
        "REGISTRY_TOKEN_CERTIFICATE": settings.REGISTRY_TOKEN_CERTIFICATE,
        "REGISTRY_TOKEN_ISSUER": settings.REGISTRY_TOKEN_ISSUER,
    }
    server = RegistryServer(tmp_path_factory.mktemp("token-registry"), env=env)
    server.realm = env["REGISTRY_TOKEN_REALM"]
    yield server
    server.stop()


@pytest.fixture
def registry(token_registry, settings, tmp_path):
    settings.REGISTRY = token_registry.address
    settings.REGISTRY_USERNAME, settings.REGISTRY_PASSWORD = USERNAME, PASSWORD
    settings.REGISTRY_TOKEN_REALM = token_registry.realm
    return token_registry


def host_login(name: str, tmp_path) -> dict:
    secret = tmp_path / f"{name}.password"
    secret.write_text(HOST_PASSWORD + "\n")
    call_command("registry_host_user", host=name, password_file=str(secret), stdout=io.StringIO())
    return {"username": f"node-{name}", "password": HOST_PASSWORD}


def push(ref: str, auth: dict) -> str:
    """Push ``ref`` with ``auth`` as an engine does: "" when it went, else the engine's error."""
    for line in docker_client().api.push(ref, auth_config=auth, stream=True, decode=True):
        if "error" in line:
            return line["error"]
    return ""


def tagged(base: str, ref: str) -> str:
    name = image_name(ref)
    docker_client().images.get(base).tag(name.path, name.tag)
    return ref


def saving(user, node, ref: str) -> Image:
    return Image.objects.create(
        name="saved", framework="x", framework_version="1", cuda_version="12", docker_ref=ref,
        visibility="private", owner=user, status="saving", node=node,
    )  # fmt: skip


def test_a_host_pushes_only_the_image_it_is_saving_and_pulls_the_catalog(registry, user, base_image, tmp_path):
    mine, theirs = make_node("sim:1xRTX3090"), make_node("sim:1xRTX3090")
    host = host_login(mine.name, tmp_path)
    control = {"username": USERNAME, "password": PASSWORD}
    catalog = tagged(base_image, f"{registry.address}/gpucloud/busybox-standin:tokens")
    assert push(catalog, control) == "", "the control plane pushes the catalog"
    own = saving(user, mine, f"{registry.address}/gpucloud-saved/u{user.pk}-i1:t-1")
    other = saving(user, theirs, f"{registry.address}/gpucloud-saved/u{user.pk}-i2:t-2")

    assert push(tagged(base_image, own.docker_ref), host) == "", "the image it is saving"
    refused = {
        "another host's save": push(tagged(base_image, other.docker_ref), host),
        "over a catalog image": push(tagged(base_image, f"{registry.address}/gpucloud/busybox-standin:evil"), host),
        "with a wrong password": push(own.docker_ref, host | {"password": "wrong-password-0123456789"}),
    }
    assert all(refused.values()), refused
    Image.objects.filter(pk=own.pk).update(status="ready")
    assert push(own.docker_ref, host), "saved: no longer its to push"

    with suppress(docker.errors.ImageNotFound):
        docker_client().images.remove(catalog, force=True)
    docker_client().api.pull(image_name(catalog).path, tag="tokens", auth_config=host)  # raises if refused
    assert manifest_digest(image_name(own.docker_ref)).startswith("sha256:"), "the control plane reads"


def test_the_token_server_grants_only_what_the_caller_may_and_names_what_is_wrong(registry, user, tmp_path):
    mine = make_node("sim:1xRTX3090")
    host = host_login(mine.name, tmp_path)
    own = saving(user, mine, f"{registry.address}/gpucloud-saved/u{user.pk}-i9:t-9")
    url = registry.realm
    service = settings.REGISTRY_TOKEN_SERVICE

    def access(auth, *scopes) -> list:
        answer = requests.get(url, params={"service": service, "scope": list(scopes)}, auth=auth, timeout=10)
        assert answer.status_code == 200, answer.text
        return jwt.decode(answer.json()["token"], options={"verify_signature": False})["access"]

    as_host = (host["username"], host["password"])
    saved = image_name(own.docker_ref).repository
    assert access(as_host, f"repository:{saved}:push,pull", "repository:gpucloud/x:push,pull,delete") == [
        {"type": "repository", "name": saved, "actions": ["push", "pull"]},
        {"type": "repository", "name": "gpucloud/x", "actions": ["pull"]},
    ]
    assert access((USERNAME, PASSWORD), "repository:gpucloud/x:delete") == [
        {"type": "repository", "name": "gpucloud/x", "actions": ["delete"]}
    ]
    assert access(as_host, "registry:catalog:*") == [], "the list of every repository: nobody's"
    wrong = requests.get(url, params={"service": service}, auth=(host["username"], "nope"), timeout=10)
    unknown = requests.get(url, params={"service": service}, auth=("node-ghost", HOST_PASSWORD), timeout=10)
    upper = {"service": service, "scope": "repository:UP/x:pull"}
    bad_scope = requests.get(url, params=upper, auth=as_host, timeout=10)
    bad_service = requests.get(url, params={"service": "other"}, auth=as_host, timeout=10)
    assert (wrong.status_code, unknown.status_code) == (401, 401)
    assert "Basic" in wrong.headers["WWW-Authenticate"]
    assert bad_scope.status_code == 400 and bad_scope.json()["errors"][0]["field"] == "scope"
    assert bad_service.status_code == 400 and bad_service.json()["errors"][0]["field"] == "service"
    call_command("registry_host_user", host=mine.name, remove=True, stdout=io.StringIO())
    assert requests.get(url, params={"service": service}, auth=as_host, timeout=10).status_code == 401


def test_a_host_cannot_delete_and_the_control_plane_deletes_with_its_own_token(registry, user, base_image, tmp_path):
    mine = make_node("sim:1xRTX3090")
    host = host_login(mine.name, tmp_path)
    ref = tagged(base_image, f"{registry.address}/gpucloud-saved/u{user.pk}-i7:t-7")
    assert push(ref, {"username": USERNAME, "password": PASSWORD}) == ""
    name = image_name(ref)
    digest = manifest_digest(name)
    token = requests.get(
        registry.realm,
        params={"service": settings.REGISTRY_TOKEN_SERVICE, "scope": f"repository:{name.repository}:delete,pull"},
        auth=(host["username"], host["password"]),
        timeout=10,
    ).json()["token"]
    refused = requests.delete(
        f"http://{registry.address}/v2/{name.repository}/manifests/{digest}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert refused.status_code == 401, "its token grants no delete"
    assert manifest_delete(name) and manifest_digest(name) is None


def test_a_hosts_api_calls_follow_the_challenge_with_its_own_login(registry, user, base_image, tmp_path, monkeypatch):
    """``scheduler.registry`` on a GPU host (``build_images`` asks whether the registry has an image): it answers the
    registry's bearer challenge with the token its own login gets, which reads but does not delete. (Only the
    caller's login is the host's: the token server, in this process, keeps the control plane's settings.)"""
    from scheduler import registry as calls
    from scheduler.registry import RegistryError

    ref = tagged(base_image, f"{registry.address}/gpucloud/busybox-standin:challenge")
    assert push(ref, {"username": USERNAME, "password": PASSWORD}) == ""
    host = host_login(make_node("sim:1xRTX3090").name, tmp_path)
    with monkeypatch.context() as patched:
        patched.setattr(calls, "credentials", lambda registry: host)
        assert manifest_digest(image_name(ref)).startswith("sha256:")
        with pytest.raises(RegistryError, match="refused"):
            manifest_delete(image_name(ref))
    assert manifest_digest(image_name(ref)).startswith("sha256:"), "still there"


def test_a_host_pulls_a_tenants_saved_image_only_while_its_own_work_runs_from_it(user):
    """The catalog is every host's to pull; a saved image only a host whose work (single-node, or a gang's member
    there) runs from it, until released; a move's snapshot only its target while it copies."""
    from portal.services.registry_tokens import Caller, Scope, granted
    from scheduler.models import Move, WorkloadMember, WorkloadStatus
    from scheduler.services.moves import move_snapshot_ref
    from tests.scheduler.factories import workload

    mine, theirs = make_node("sim:1xRTX3090"), make_node("sim:1xRTX3090")
    host = Caller(subject=f"node-{mine.name}", host=mine.name)
    saved = f"gpucloud-saved/u{user.pk}-i5"

    def pulls(name: str) -> bool:
        return granted(host, Scope("repository", name, ("pull",))) == ("pull",)

    assert pulls("gpucloud/busybox-standin") and not pulls(saved)
    elsewhere = workload(user, image_ref=f"r.example:5000/{saved}:t", status=WorkloadStatus.RUNNING, node=theirs)
    assert not pulls(saved), "another host's work"
    here = workload(user, image_ref=f"r.example:5000/{saved}:t", status=WorkloadStatus.STOPPED, node=mine)
    assert pulls(saved), "a stopped instance here starts from it again"
    here.status = WorkloadStatus.RELEASED
    here.save(update_fields=["status"])
    assert not pulls(saved)
    gang = workload(user, image_ref=f"r.example:5000/{saved}:t", status=WorkloadStatus.STARTING)
    WorkloadMember.objects.create(workload=gang, rank=1, node=mine, node_name=mine.name)
    assert pulls(saved), "a gang's member here"

    move = Move.objects.create(workload=elsewhere, source=theirs, target=mine)
    snapshot = image_name(move_snapshot_ref(move)).repository
    assert pulls(snapshot)
    assert granted(Caller(subject="node-x", host=theirs.name), Scope("repository", snapshot, ("pull",))) == ()
    Move.objects.filter(pk=move.pk).update(status="done")
    assert not pulls(snapshot)
