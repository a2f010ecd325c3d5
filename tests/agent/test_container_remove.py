"""Two removals of one container meet: Docker answers the second with 409 "removal of container ... is already in
progress". A job's relaunch that meets its old container's cleanup must not fail on that (it used up a gang's
restarts on the several-host setup), nor go on before the name is free: it creates a container of that name."""

import threading
import uuid

import docker
import requests

from agent import launcher
from tests.conftest import TEST_IMAGE


def test_a_removal_already_in_progress_is_waited_for_until_the_name_is_free(base_image):
    client = launcher.docker_client()
    name = f"gpuc-rm-{uuid.uuid4().hex[:8]}"
    container = client.containers.run(TEST_IMAGE, ["sleep", "600"], name=name, detach=True, network_mode="none")
    other = threading.Thread(target=client.api.remove_container, args=(name,), kwargs={"force": True})

    class SecondRemover:
        """The container as the second remover sees it: the first removal has begun, Docker answers 409."""

        id = container.id

        def remove(self, force):
            other.start()
            answer = requests.Response()
            answer.status_code = 409
            raise docker.errors.APIError(
                "409 Client Error: Conflict",
                response=answer,
                explanation=f"removal of container {container.id} is already in progress",
            )

        def wait(self, **options):
            return container.wait(**options)

    try:
        launcher.container_gone(SecondRemover())
        assert launcher._find(name) is None  # the name is free as it returns
        client.containers.create(TEST_IMAGE, ["true"], name=name, network_mode="none").remove()
    finally:
        other.join()
        if launcher._find(name) is not None:
            client.api.remove_container(name, force=True)
