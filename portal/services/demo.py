"""The demo catalog: GPU types and framework images modelled on what GPU clouds offer."""

from decimal import Decimal

GPU_TYPES = [
    # name (as nodes report it), display name, memory GB, on-demand, spot (CNY per card-hour)
    ("RTX3090", "RTX 3090 24GB", 24, "1.58", "0.79"),
    ("RTXA5000", "RTX A5000 24GB", 24, "1.38", "0.69"),
    ("A100-80GB", "A100 80GB", 80, "6.68", "3.34"),
    ("H100", "H100 80GB", 80, "13.98", "6.99"),
]

IMAGES = [
    # name, framework, version, CUDA ("": a CPU build), Python, docker reference. Each holds what it names: built
    # by manage.py build_images from the recipes in agent/framework_images.py (Debian 12, pinned wheels); new
    # rows start "building" until their image is there (on the host, or in the registry).
    ("PyTorch 2.13.0 (CPU)", "PyTorch", "2.13.0", "", "3.11", "gpucloud/pytorch:2.13.0-cpu"),
    ("TensorFlow 2.21.0 (CPU)", "TensorFlow", "2.21.0", "", "3.11", "gpucloud/tensorflow:2.21.0-cpu"),
    ("Python 3.11 (Debian 12)", "Python", "3.11", "", "3.11", "gpucloud/python:3.11-bookworm"),
]

# The demo catalog's earlier images: one BusyBox stand-in under six framework names. Rows of them stay (work
# made from them refers to them) but are no longer offered.
RETIRED_IMAGES = {
    "PyTorch 2.5.1 / CUDA 12.4",
    "PyTorch 2.1.2 / CUDA 12.1",
    "PyTorch 1.13.1 / CUDA 11.7",
    "TensorFlow 2.15 / CUDA 12.2",
    "TensorFlow 2.9 / CUDA 11.2",
    "Miniconda / CUDA 12.4",
}
WAITING_FOR_BUILD = "waiting for manage.py build_images"

# A tiny image for tests and the several-host setup's checks that need a container but no framework (BusyBox's
# sh, nc, sleep: a few MB, starts in well under a second). Never part of the demo catalog; load_demo --stand-in
# adds it, under a name that says what it is.
STANDIN_IMAGE = "gpucloud/busybox-standin:latest"
STANDIN_NAME = "BusyBox stand-in (tests)"
RETIRED_REASON = "no longer offered: it was a BusyBox stand-in without its framework"


def catalog_load() -> None:
    """Create or update the demo GPU types and images (idempotent)."""
    from billing.models import RateCard
    from portal.models import GpuType, Image, ImageStatus
    from scheduler.registry import registry_ref

    # The default card: CPU-only starts, storage, extras (GPU types get their own from their list price).
    if not RateCard.objects.filter(gpu_model="").exists():
        from django.utils import timezone

        RateCard.objects.create(gpu_model="", effective_from=timezone.now(), card_hour=Decimal(0))
    for name, display, memory, price, spot in GPU_TYPES:
        GpuType.objects.update_or_create(
            name=name,
            defaults=dict(
                display_name=display,
                memory_gb=memory,
                price_per_hour=Decimal(price),
                spot_price_per_hour=Decimal(spot),
                currency="CNY",
            ),
        )
    for name, framework, version, cuda, python, ref in IMAGES:
        # Keyed by name: with a registry (settings.REGISTRY) the reference moves into it.
        fields = dict(
            docker_ref=registry_ref(ref),
            framework=framework,
            framework_version=version,
            cuda_version=cuda,
            python_version=python,
        )
        Image.objects.update_or_create(
            name=name,
            visibility="official",
            defaults=fields,
            create_defaults=fields | {"status": ImageStatus.BUILDING, "status_reason": WAITING_FOR_BUILD},
        )
    Image.objects.filter(name__in=RETIRED_IMAGES, visibility="official").exclude(status=ImageStatus.RETIRED).update(
        status=ImageStatus.RETIRED, status_reason=RETIRED_REASON
    )


def stand_in_load():
    """The BusyBox stand-in as an official image (its name says so), for tests and the several-host setup."""
    from portal.models import Image
    from scheduler.registry import registry_ref

    image, _ = Image.objects.update_or_create(
        name=STANDIN_NAME,
        visibility="official",
        defaults={"framework": "BusyBox", "cuda_version": "", "docker_ref": registry_ref(STANDIN_IMAGE)},
    )
    return image
