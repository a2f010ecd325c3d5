"""Build the local base image and make every catalog image available: on this engine, or in the registry.

No public registry is reachable on development machines: the catalog's framework
images are stand-ins built from the busybox base. Without a registry
(settings.REGISTRY empty) each is tagged on this engine, which is the only host.
With one, the catalog's references name it (``load_demo`` writes them so): each image
the registry lacks is built here, tagged with its registry name and pushed once; every
host then pulls it on first use. Run it where the Docker engine may push to the
registry (TLS trusted, or the registry on loopback / allowed with --insecure-registry).

It talks to a Docker engine, so it lives with the node side's commands (``node_agent``,
``fence``), not in the web tier's app: production runs it in the node agent's container.
"""

import time

from django.core.management.base import BaseCommand, CommandError

from portal.models import Image, ImageVisibility
from portal.services.demo import BASE_IMAGE
from scheduler.node.images import base_image_build, image_exists, image_tag
from scheduler.node.launcher import image_push
from scheduler.registry import RegistryError, image_name, manifest_digest


class Command(BaseCommand):
    help = "Build gpucloud/base locally; tag the catalog's missing images from it, or push them to REGISTRY."

    def handle(self, *args, **options):
        if not image_exists(BASE_IMAGE):
            self.stdout.write(f"building {BASE_IMAGE} from a busybox root filesystem ...")
            base_image_build(BASE_IMAGE)
        refs = Image.objects.exclude(visibility=ImageVisibility.PRIVATE).values_list("docker_ref", flat=True)
        for ref in sorted(set(refs)):
            try:
                self._provide(ref)
            except RegistryError as exc:
                raise CommandError(exc.message) from exc
        self.stdout.write("images ready")

    def _provide(self, ref: str) -> None:
        name = image_name(ref)
        if not name.registry:
            if not image_exists(ref):
                image_tag(BASE_IMAGE, ref)
                self.stdout.write(f"tagged {ref} (stand-in built from {BASE_IMAGE})")
            return
        if manifest_digest(name) is not None:
            self.stdout.write(f"{ref} is in the registry already")
            return
        local = f"{name.repository}:{name.tag}"
        if not image_exists(ref):
            # A real image built on this engine under the plain name is pushed; otherwise the stand-in.
            image_tag(local if image_exists(local) else BASE_IMAGE, ref)
        started = time.monotonic()
        image_push(ref)
        self.stdout.write(f"pushed {ref} in {time.monotonic() - started:.2f}s")
