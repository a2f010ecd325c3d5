"""Scheduling policy in plain Python (numpy, no Django), shared by the live tick and the simulator.

- ``cluster``: free capacity as arrays, each card's share class (one share size per card) and the
  offered share sizes; ``placement``: where one request goes
  (FGD, best fit, first fit, random; gangs across nodes; ``fgd_few``: FGD's scores of a few nodes in
  plain Python, the same to the bit); ``mlfq``: queue levels
  and service; ``decide``: one tick's placements (``Place``, one ``Part`` per
  member), preemptions, reservations, elastic resizes and waiting reasons.
"""

from scheduler.policy.cluster import (
    SHARE_FRACTIONS,
    SHARE_SIZES,
    WHOLE_CARD,
    CardSpec,
    ClusterState,
    NodeSpec,
    round_up_share,
    share_class_of,
)
from scheduler.policy.decide import DISCIPLINES, Decisions, Discipline, Part, Place, Quotas, Resize, decide
from scheduler.policy.mlfq import HIGH, LOW, NORMAL, MlfqConfig, Work, accrue, level_of
from scheduler.policy.placement import STRATEGIES, Request, TaskType, choose, choose_parts, is_gang, task_mix

__all__ = [
    "DISCIPLINES",
    "HIGH",
    "LOW",
    "NORMAL",
    "SHARE_FRACTIONS",
    "SHARE_SIZES",
    "STRATEGIES",
    "WHOLE_CARD",
    "CardSpec",
    "ClusterState",
    "Decisions",
    "Discipline",
    "MlfqConfig",
    "NodeSpec",
    "Part",
    "Place",
    "Quotas",
    "Request",
    "Resize",
    "TaskType",
    "Work",
    "accrue",
    "choose",
    "choose_parts",
    "decide",
    "is_gang",
    "level_of",
    "round_up_share",
    "share_class_of",
    "task_mix",
]
