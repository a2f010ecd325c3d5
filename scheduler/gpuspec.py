"""GPU models and the simulated-inventory spec (``sim:4xRTX3090,2xA100-80GB``): pure, no host code.

Read by the settings (a bad ``GPU_BACKEND`` fails loudly), the trace simulator (``simulate``) and the
GPU host's discovery (``agent.gpus``), which turns a spec into the cards of a simulated host.
"""

from __future__ import annotations

import re

from core.errors import InvalidInput

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
