"""Build the local base image and tag every catalog image this engine lacks.

No registry is reachable on development machines: the catalog's framework
images are stand-ins built from the busybox base. A real deployment points
``Image.docker_ref`` at its registry and never runs this.
"""

from django.core.management.base import BaseCommand

from portal.demo import BASE_IMAGE
from portal.models import Image
from scheduler.node.images import base_image_build, image_exists, image_tag


class Command(BaseCommand):
    help = "Build gpucloud/base locally and tag the catalog's missing images from it."

    def handle(self, *args, **options):
        if not image_exists(BASE_IMAGE):
            self.stdout.write(f"building {BASE_IMAGE} from a busybox root filesystem ...")
            base_image_build(BASE_IMAGE)
        for ref in Image.objects.values_list("docker_ref", flat=True).distinct():
            if not image_exists(ref):
                image_tag(BASE_IMAGE, ref)
                self.stdout.write(f"tagged {ref} (stand-in built from {BASE_IMAGE})")
        self.stdout.write("images ready")
