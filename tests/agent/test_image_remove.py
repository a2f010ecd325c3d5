"""A host removes an image from its engine only for a saved image the database says is being deleted (or was):
a redelivered message, or one another host forged (any host holds the signing key), must not destroy an image
that a host may hold the only copy of. Against the real Docker engine."""

import uuid

import docker
import pytest

from agent import actions
from agent.launcher import docker_client
from core.messages import ToScheduler
from portal.models import Image, ImageStatus
from tests.conftest import make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def tags(base_image):
    """Tags of the stand-in made for the test (only ever these are removed here), removed after it."""
    made = []

    def tag(repository: str) -> str:
        made.append(f"{repository}:test-{uuid.uuid4().hex[:8]}")
        docker_client().images.get(base_image).tag(made[-1])
        return made[-1]

    yield tag
    for ref in made:
        try:
            docker_client().images.remove(ref)
        except docker.errors.ImageNotFound:
            pass


@pytest.fixture
def saved(user, tags):
    """A user's saved image, ready, kept on one host only (no registry)."""
    return Image.objects.create(
        name="saved", framework="x", framework_version="1", cuda_version="12", docker_ref=tags("gpucloud-saved"),
        visibility="private", owner=user, node=make_node(),
    )  # fmt: skip


def on_engine(ref: str) -> bool:
    try:
        docker_client().images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


def test_a_removal_of_an_image_that_is_not_being_deleted_leaves_it(saved, tags, monkeypatch):
    cached = tags("gpucloud-test/cached")  # a catalog image, say
    replies = []
    monkeypatch.setattr(actions, "send", lambda task, *args: replies.append((task, *args)))

    actions.agent_image_remove(saved.docker_ref, ToScheduler.IMAGE_REMOVED, saved.pk)  # forged, or stale
    actions.agent_image_remove(saved.docker_ref, "", 0)  # as if the registry had deleted it
    actions.agent_image_remove(cached, "", 0)  # an image no saved image names
    assert on_engine(saved.docker_ref) and on_engine(cached) and replies == []

    Image.objects.filter(pk=saved.pk).update(status=ImageStatus.DELETING)
    actions.agent_image_remove(saved.docker_ref, ToScheduler.IMAGE_REMOVED, saved.pk + 1)  # another image's reply
    assert on_engine(saved.docker_ref) and replies == []

    actions.agent_image_remove(saved.docker_ref, ToScheduler.IMAGE_REMOVED, saved.pk)  # the owner deletes it
    assert not on_engine(saved.docker_ref)
    assert replies == [(ToScheduler.IMAGE_REMOVED, saved.pk, 0, "")]
