"""Scheduling policy in plain Python (numpy, no Django), shared by the live tick and the simulator.

- ``cluster``: free capacity as arrays; ``placement``: where one request goes
  (FGD, best fit, first fit, random); ``mlfq``: queue levels and service;
  ``decide``: one tick's placements, preemptions and waiting reasons.
"""

from scheduler.policy.cluster import WHOLE_CARD, CardSpec, ClusterState, NodeSpec
from scheduler.policy.decide import DISCIPLINES, Decisions, Discipline, Quotas, decide
from scheduler.policy.mlfq import HIGH, LOW, NORMAL, MlfqConfig, Work, accrue, level_of
from scheduler.policy.placement import STRATEGIES, Request, TaskType, choose, task_mix

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
    "Quotas",
    "Request",
    "TaskType",
    "Work",
    "accrue",
    "choose",
    "decide",
    "level_of",
    "task_mix",
]
