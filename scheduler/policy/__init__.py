"""Scheduling policy in plain Python (numpy, no Django), shared by the live tick and the simulator.

- ``cluster``: free capacity as arrays; ``placement``: where one request goes
  (FGD, best fit, first fit, random; gangs across nodes); ``mlfq``: queue levels
  and service; ``decide``: one tick's placements (``Place``, one ``Part`` per
  member), preemptions, reservations, elastic resizes and waiting reasons.
"""

from scheduler.policy.cluster import WHOLE_CARD, CardSpec, ClusterState, NodeSpec
from scheduler.policy.decide import DISCIPLINES, Decisions, Discipline, Part, Place, Quotas, Resize, decide
from scheduler.policy.mlfq import HIGH, LOW, NORMAL, MlfqConfig, Work, accrue, level_of
from scheduler.policy.placement import STRATEGIES, Request, TaskType, choose, choose_parts, is_gang, task_mix

__all__ = [
    "DISCIPLINES",
    "HIGH",
    "LOW",
    "NORMAL",
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
    "task_mix",
]
