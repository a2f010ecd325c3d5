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
    # name, framework, version, CUDA, Python, docker reference
    ("PyTorch 2.5.1 / CUDA 12.4", "PyTorch", "2.5.1", "12.4", "3.12", "gpucloud/pytorch:2.5.1-cuda12.4"),
    ("PyTorch 2.1.2 / CUDA 12.1", "PyTorch", "2.1.2", "12.1", "3.10", "gpucloud/pytorch:2.1.2-cuda12.1"),
    ("PyTorch 1.13.1 / CUDA 11.7", "PyTorch", "1.13.1", "11.7", "3.8", "gpucloud/pytorch:1.13.1-cuda11.7"),
    ("TensorFlow 2.15 / CUDA 12.2", "TensorFlow", "2.15.0", "12.2", "3.11", "gpucloud/tensorflow:2.15-cuda12.2"),
    ("TensorFlow 2.9 / CUDA 11.2", "TensorFlow", "2.9.0", "11.2", "3.8", "gpucloud/tensorflow:2.9-cuda11.2"),
    ("Miniconda / CUDA 12.4", "Miniconda", "24.9", "12.4", "3.12", "gpucloud/miniconda:cuda12.4"),
]

BASE_IMAGE = "gpucloud/base:latest"


def catalog_load() -> None:
    """Create or update the demo GPU types and images (idempotent)."""
    from billing.models import RateCard
    from portal.models import GpuType, Image
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
        Image.objects.update_or_create(
            name=name,
            visibility="official",
            defaults=dict(
                docker_ref=registry_ref(ref),
                framework=framework,
                framework_version=version,
                cuda_version=cuda,
                python_version=python,
            ),
        )
