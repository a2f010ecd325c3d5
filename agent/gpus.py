"""What cards a host has: from NVML where there is a driver, else a simulated inventory.

``GPU_BACKEND`` is ``nvml``, ``auto`` (NVML, falling back to ``SIM_GPU_DEFAULT``
when no NVIDIA driver is present) or a simulated spec such as
``sim:4xRTX3090,4xA100-80GB``. Simulated cards are marked as such everywhere.
"""

from __future__ import annotations

import uuid

from core.errors import InvalidInput
from scheduler.gpuspec import parse_sim_spec
from scheduler.services.nodes import GpuInfo


def model_key(nvml_name: str) -> str:
    """Catalog key for an NVML device name: 'NVIDIA A100-SXM4-80GB' -> 'A100-SXM4-80GB'."""
    return nvml_name.removeprefix("NVIDIA ").strip().replace(" ", "-")


def simulated_inventory(spec: str, node_name: str) -> list[GpuInfo]:
    gpus = []
    for count, model, memory in parse_sim_spec(spec):
        for _ in range(count):
            index = len(gpus)
            card_uuid = uuid.uuid5(uuid.NAMESPACE_DNS, f"{node_name}.gpu{index}.sim")
            gpus.append(GpuInfo(index, f"GPU-sim-{card_uuid}", model, memory))
    return gpus


def nvml_inventory() -> list[GpuInfo]:
    """Cards as NVML reports them; raises pynvml.NVMLError where there is no driver."""
    import pynvml

    pynvml.nvmlInit()
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            card_uuid = pynvml.nvmlDeviceGetUUID(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            gpus.append(GpuInfo(index, _text(card_uuid), model_key(_text(name)), int(memory)))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def discover(backend: str, *, node_name: str, sim_default: str) -> tuple[list[GpuInfo], bool]:
    """The host's cards and whether they are simulated."""
    if backend.startswith("sim:"):
        return simulated_inventory(backend, node_name), True
    if backend not in ("nvml", "auto"):
        raise InvalidInput(f"GPU_BACKEND must be 'nvml', 'auto' or 'sim:...', got {backend!r}", field="gpu_backend")
    import pynvml

    try:
        return nvml_inventory(), False
    except pynvml.NVMLError:
        if backend == "nvml":
            raise
        return simulated_inventory(sim_default, node_name), True
