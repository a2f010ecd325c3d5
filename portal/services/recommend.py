"""Which GPU type and how many cards a model needs: the memory rule of thumb, then the cheapest fit.

Training with Adam holds, per parameter: the weights and their gradients in
the training precision plus the optimizer state — in bf16/fp16 mixed
precision an fp32 master copy and two fp32 moments (2 + 2 + 12 = 16 bytes),
in fp32 the two moments (4 + 4 + 8 = 16 bytes). Inference holds the weights
only (4, 2, 1 or 0.5 bytes). Activations, CUDA context and
fragmentation take ACTIVATION_OVERHEAD on top.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

from core.errors import InvalidInput

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1, "int4": 0.5}
ADAM_STATE_BYTES = 12  # fp32 master weights + two moments
ACTIVATION_OVERHEAD = 1.2


@dataclass(frozen=True)
class Recommendation:
    gpu_type: object  # portal.models.GpuType
    cards: int
    memory_gb: float
    price_per_hour: Decimal
    reason: str


def memory_needed_gb(*, params_billion: float, precision: str, task: str) -> float:
    if params_billion <= 0:
        raise InvalidInput("must be a positive number of billions of parameters", field="model_params_b")
    if precision not in BYTES:
        raise InvalidInput(f"must be one of {', '.join(BYTES)}", field="precision")
    if task not in ("train", "inference"):
        raise InvalidInput("must be train or inference", field="task")
    weight = BYTES[precision]
    if task == "train":
        if precision in ("int8", "int4"):
            raise InvalidInput("training needs fp32, bf16 or fp16", field="precision")
        per_param = 2 * weight + (ADAM_STATE_BYTES if precision != "fp32" else 8)
    else:
        per_param = weight
    return params_billion * per_param * ACTIVATION_OVERHEAD  # 1e9 params x bytes = GB


def recommend(*, gpu_types, params_billion: float, precision: str = "bf16", task: str = "train") -> Recommendation:
    """The cheapest (type, cards) whose total memory holds the model, among types nodes can serve."""
    need = memory_needed_gb(params_billion=params_billion, precision=precision, task=task)
    best = None
    for gpu_type in gpu_types:
        most = gpu_type.capacity.get("max_cards_per_node", 0)
        cards = max(1, math.ceil(need / gpu_type.memory_gb))
        if not most or cards > most:
            continue
        price = gpu_type.price_per_hour * cards
        if best is None or (price, cards) < (best.price_per_hour, best.cards):
            reason = (
                f"{params_billion:g}B parameters, {precision} {task}: about {need:.0f} GB of GPU memory; "
                f"{cards} x {gpu_type.display_name} ({cards * gpu_type.memory_gb} GB) is the cheapest fit "
                f"at {price} {gpu_type.currency}/h"
            )
            best = Recommendation(gpu_type, cards, round(need, 1), price, reason)
    if best is None:
        raise InvalidInput(
            f"about {need:.0f} GB of GPU memory is needed and no node has enough cards of one type", field="gpu_type"
        )
    return best
