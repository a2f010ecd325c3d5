"""What cards a host has: from NVML where there is a driver, else a simulated inventory.

``GPU_BACKEND`` is ``nvml``, ``auto`` (NVML, falling back to ``SIM_GPU_DEFAULT``
when no NVIDIA driver is present) or a simulated spec such as
``sim:4xRTX3090,4xA100-80GB``. Simulated cards are marked as such everywhere.
"""

from __future__ import annotations

import re
import uuid

from scheduler.errors import InvalidInput
from scheduler.services.nodes import GpuInfo

# Card memory for simulated models that do not carry it in their name.
KNOWN_MEMORY_MB = {
    "RTX3090": 24576,
    "RTX4090": 24576,
    "RTXA5000": 24576,
    "A5000": 24576,
    "RTXA6000": 49152,
    "V100": 32768,
    "P100": 16384,
    "T4": 15360,
    "L4": 23034,
    "L40S": 46068,
    "A10": 23028,
    "H100": 81559,
    "H200": 143771,
    "A100": 40960,
}
SIM_ITEM = re.compile(r"^(\d+)x([A-Za-z0-9][A-Za-z0-9_.-]*)$")
MEMORY_SUFFIX = re.compile(r"-(\d+)GB$", re.IGNORECASE)


def model_key(nvml_name: str) -> str:
    """Catalog key for an NVML device name: 'NVIDIA A100-SXM4-80GB' -> 'A100-SXM4-80GB'."""
    return nvml_name.removeprefix("NVIDIA ").strip().replace(" ", "-")


def parse_sim_spec(spec: str) -> list[tuple[int, str, int]]:
    """'sim:4xRTX3090,2xA100-80GB' -> [(4, 'RTX3090', 24576), (2, 'A100-80GB', 81920)]."""
    if not spec.startswith("sim:"):
        raise InvalidInput(f"a simulated GPU spec starts with 'sim:', got {spec!r}", field="gpu_backend")
    items = []
    for part in filter(None, (p.strip() for p in spec[4:].split(","))):
        match = SIM_ITEM.match(part)
        if not match:
            raise InvalidInput(f"bad item {part!r} in {spec!r}: expected <count>x<MODEL>", field="gpu_backend")
        count, model = int(match[1]), match[2]
        suffix = MEMORY_SUFFIX.search(model)
        memory = int(suffix[1]) * 1024 if suffix else KNOWN_MEMORY_MB.get(model)
        if memory is None:
            raise InvalidInput(
                f"unknown memory for simulated {model!r}: write it as {model}-<N>GB", field="gpu_backend"
            )
        items.append((count, model, memory))
    if not items:
        raise InvalidInput(f"{spec!r} lists no GPUs", field="gpu_backend")
    return items


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
