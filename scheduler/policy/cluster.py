"""Free capacity of a cluster as numpy arrays, so placement can score every card at once.

Rows are nodes, columns are card slots (padded: a node with fewer cards has
slots that do not exist). Shares are integer thousandths of a card; CPU is in
whatever unit the caller uses consistently (the live system uses milli-cores).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

WHOLE_CARD = 1000
ANY_MODEL = -1


@dataclass
class CardSpec:
    id: object
    model: str
    memory_mb: int
    free_milli: int = WHOLE_CARD
    free_memory_mb: int | None = None


@dataclass
class NodeSpec:
    id: object
    cpu_free: int
    memory_free_mb: int
    cards: list[CardSpec] = field(default_factory=list)
    # Where the node sits (a rack or switch label) when the inventory says so: a gang prefers one group.
    group: object = None


class ClusterState:
    """Mutable free capacity; ``take`` and ``give`` keep every array consistent."""

    def __init__(self, nodes: list[NodeSpec]):
        self.node_ids = [n.id for n in nodes]
        self.node_index = {n.id: i for i, n in enumerate(nodes)}
        width = max((len(n.cards) for n in nodes), default=0)
        count = len(nodes)
        self.models: dict[str, int] = {}
        self.cpu_free = np.array([n.cpu_free for n in nodes], dtype=np.int64)
        self.mem_free = np.array([n.memory_free_mb for n in nodes], dtype=np.int64)
        self.exists = np.zeros((count, width), dtype=bool)
        self.free = np.zeros((count, width), dtype=np.int64)
        self.card_mem_total = np.zeros((count, width), dtype=np.int64)
        self.card_mem_free = np.zeros((count, width), dtype=np.int64)
        self.model = np.full((count, width), ANY_MODEL - 1, dtype=np.int64)
        self.card_ids: list[list[object]] = []
        labels: dict[object, int] = {}
        # Group code per node (-1: no label); gangs keep to one group when one can hold them.
        self.group = np.array([-1 if n.group is None else labels.setdefault(n.group, len(labels)) for n in nodes])
        # Bumped whenever a node's free capacity changes: scores cached per node stay valid until then.
        self.version = np.zeros(count, dtype=np.int64)
        self.score_cache: dict = {}
        for i, node in enumerate(nodes):
            self.card_ids.append([c.id for c in node.cards])
            for j, card in enumerate(node.cards):
                self.exists[i, j] = True
                self.free[i, j] = card.free_milli
                self.card_mem_total[i, j] = card.memory_mb
                self.card_mem_free[i, j] = card.memory_mb if card.free_memory_mb is None else card.free_memory_mb
                self.model[i, j] = self.model_code(card.model)

    def copy(self) -> ClusterState:
        """A scratch copy whose capacity can change without touching this one."""
        other = object.__new__(ClusterState)
        other.__dict__.update(self.__dict__)
        for name in ("cpu_free", "mem_free", "free", "card_mem_free", "version"):
            setattr(other, name, getattr(self, name).copy())
        other.score_cache = {}
        return other

    def model_code(self, name: str | None) -> int:
        if name is None:
            return ANY_MODEL
        return self.models.setdefault(name, len(self.models))

    def width(self, model: str | None) -> int:
        """Most cards of ``model`` (any model: None) that one node has: wider work is a gang across nodes."""
        key = ("width", model)
        if key not in self.score_cache:
            cards = self.exists if model is None else self.exists & (self.model == self.model_code(model))
            self.score_cache[key] = int(cards.sum(axis=1).max()) if len(self.node_ids) else 0
        return self.score_cache[key]

    @property
    def total_cards(self) -> int:
        return int(self.exists.sum())

    def memory_for(self, node: int, card: int, milli: int) -> int:
        return int(self.card_mem_total[node, card]) * milli // WHOLE_CARD

    def take(self, node: int, cards: list[int], milli: int, cpu: int, memory_mb: int) -> list[int]:
        """Take capacity; returns the GPU memory taken on each card."""
        taken = []
        for card in cards:
            memory = self.memory_for(node, card, milli)
            self.free[node, card] -= milli
            self.card_mem_free[node, card] -= memory
            taken.append(memory)
        self.cpu_free[node] -= cpu
        self.mem_free[node] -= memory_mb
        self.version[node] += 1
        return taken

    def give(self, node: int, cards: list[int], milli: int, cpu: int, memory_mb: int) -> None:
        for card in cards:
            self.free[node, card] += milli
            self.card_mem_free[node, card] += self.memory_for(node, card, milli)
        self.cpu_free[node] += cpu
        self.mem_free[node] += memory_mb
        self.version[node] += 1

    def allocated_share(self) -> float:
        """Fraction of all GPU capacity allocated (0..1)."""
        total = self.exists.sum() * WHOLE_CARD
        return float((WHOLE_CARD * self.exists - np.where(self.exists, self.free, 0)).sum() / total) if total else 0.0
