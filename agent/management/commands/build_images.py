"""Make every catalog image available — on this engine, or in the registry — and mark it ready in the catalog.

The catalog's framework images are built here from their recipes (agent/framework_images.py: Debian 12 and
pinned wheels, cached by a hash of the recipe; the first build of the PyTorch image takes about two minutes).
Without a registry (settings.REGISTRY empty) each is built on this engine, which is the only host. With one,
the catalog's references name it (``load_demo`` writes them so): each image the registry lacks is built here,
tagged with its registry name and pushed once; every host then pulls it on first use. Run it where the Docker
engine may push to the registry (TLS trusted, or the registry on loopback / allowed with --insecure-registry).

While it builds an image, the catalog rows naming it are "building" (listed, but work cannot be made from them:
the create form and the API say so at the image field); then "ready", or "failed" with the reason. An image with
no recipe here that this engine already holds (an operator's own) is taken as it is.

It talks to a Docker engine, so it lives with the node side's commands (``node_agent``,
``fence``), not in the web tier's app: production runs it in the node agent's container.
"""

import platform
import time

import docker
import requests
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from agent import framework_images
from agent.images import STANDIN_IMAGE, image_exists, image_tag, stand_in_ensure
from agent.launcher import image_push
from portal.models import Image, ImageStatus, ImageVisibility
from scheduler.registry import RegistryError, image_name, manifest_digest

# A response the engine cut short or never gave (its connection closed or timed out): requests' transport errors.
# Not docker's APIError (an answer, refused): that is the same the second time.
CUT = (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError, requests.exceptions.Timeout)


class Command(BaseCommand):
    help = "Build the catalog's images on this engine (cached), or push them to REGISTRY; mark them ready."

    def add_arguments(self, parser):
        parser.add_argument(
            "--only", action="append", default=[], metavar="REF", help="Only this catalog reference (repeat)."
        )

    def handle(self, *args, only, **options):
        rows = Image.objects.exclude(visibility=ImageVisibility.PRIVATE).exclude(status=ImageStatus.RETIRED)
        refs = sorted(set(rows.values_list("docker_ref", flat=True)))
        if only:
            refs = [ref for ref in refs if ref in only or _local(ref) in only]
        failed = []
        for ref in refs:
            waiting = Image.objects.filter(docker_ref=ref, status__in=[ImageStatus.BUILDING, ImageStatus.FAILED])
            waiting.update(
                status=ImageStatus.BUILDING,
                status_reason=f"building on {platform.node()} since {time.strftime('%H:%M:%S')}",
            )
            try:
                self._provide_once_more_if_cut(ref)
            except (RegistryError, framework_images.BuildError, docker.errors.DockerException, *CUT) as exc:
                message = getattr(exc, "message", None) or str(exc)
                self.stderr.write(f"{ref}: {message}")
                waiting.update(status=ImageStatus.FAILED, status_reason=message.splitlines()[0][:255])
                failed.append(ref)
                continue
            Image.objects.filter(docker_ref=ref, status__in=[ImageStatus.BUILDING, ImageStatus.FAILED]).update(
                status=ImageStatus.READY, status_reason=""
            )
        if failed:
            raise CommandError(f"not available: {', '.join(failed)}")
        self.stdout.write("images ready")

    def _provide_once_more_if_cut(self, ref: str) -> None:
        """``_provide``, and once more where the engine's answer was cut short (a CI run on a loaded machine saw
        "Response ended prematurely" while the PyTorch image was made on a new host's engine): every step is
        idempotent, as a built image is found again and a pushed one is in the registry. Cut twice: failed."""
        try:
            self._provide(ref)
        except CUT as exc:
            self.stderr.write(f"{ref}: the Docker engine's answer was cut short ({exc}); once more")
            self._provide(ref)

    def _provide(self, ref: str) -> None:
        name = image_name(ref)
        if not name.registry:
            self._build(ref)
            return
        if manifest_digest(name) is not None:
            self.stdout.write(f"{ref} is in the registry already")
            return
        local = _local(ref)
        if not image_exists(ref):
            self._build(local)
            image_tag(local, ref)
        started = time.monotonic()
        image_push(ref)
        self.stdout.write(f"pushed {ref} in {time.monotonic() - started:.2f}s")

    def _build(self, ref: str) -> None:
        if ref in framework_images.RECIPES:
            client = docker.DockerClient(base_url=settings.DOCKER_BASE_URL, timeout=900)
            framework_images.ensure(ref, client, say=self._progress)
        elif ref == STANDIN_IMAGE:
            stand_in_ensure()
        elif not image_exists(ref):
            raise framework_images.BuildError(
                f"no recipe for {ref} and this engine does not have it: build it and push it to the registry "
                "(README: Images)"
            )

    def _progress(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()  # a build takes minutes: each step as it happens


def _local(ref: str) -> str:
    """``ref`` without its registry: the name the image is built under on this engine."""
    name = image_name(ref)
    return f"{name.repository}:{name.tag}"
