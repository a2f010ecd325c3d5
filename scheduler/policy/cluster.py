"""Free capacity of a cluster as numpy arrays, so placement can score every card at once.

Rows are nodes, columns are card slots (padded: a node with fewer cards has
slots that do not exist). Shares are integer thousandths of a card; CPU is in
whatever unit the caller uses consistently (the live system uses milli-cores). Disk is in GB: what a node
offers its tenants' disks less what their disks hold there (``NodeSpec.disk_free_gb``; None: not counted).

One share size per card: a fraction is enforced by the card's MPS daemon, whose limits are set per card
(``agent.mps``), so fractions of different sizes cannot share a card. The first fraction placed on an
empty card sets the card's class (its share size, ``card_class``); only fractions of exactly that size
join it, until it is empty again (class 0: any size). Whole-card work takes only empty cards.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from decimal import Decimal

import numpy as np

WHOLE_CARD = 1000
ANY_MODEL = -1
# The fractions of a card the product offers, in thousandths: each fills a card exactly (so a card of
# one class has no share left that its class cannot use). Measured with bench/share_classes.py (README,
# "Fractions: one share size per card"): every set tried costs 3.5-4 % of openb's packing against
# free-form fractions, 1-2 % of Philly's JCT. Quarters instead of fifths pack 0.4 points more on openb
# (no difference on Philly) but need two decimals where the portal stores gpus (one today). The portal
# refuses other fractions; the trace simulator rounds them up.
SHARE_SIZES = (100, 200, 500)
SHARE_FRACTIONS = tuple(Decimal(size) / WHOLE_CARD for size in SHARE_SIZES)  # as users write them: 0.5
NO_CLASS = 0  # an empty card (or one whose fractions are not known): takes a fraction of any size
MIXED = -1  # fractions of several sizes (placed before the rule): takes no new fraction until it empties
UNCOUNTED = 2**60  # the free disk of a node whose disk is not counted (the trace simulator's, most tests')


@dataclass
class CardSpec:
    id: object
    model: str
    memory_mb: int
    free_milli: int = WHOLE_CARD
    free_memory_mb: int | None = None
    # The size of the fractions it holds (all alike), NO_CLASS when it holds none, MIXED when they differ.
    share_class: int = NO_CLASS


def share_class_of(fractions) -> int:
    """A card's class from the shares of it that are allocated (thousandths; whole cards are no class)."""
    sizes = {milli for milli in fractions if 0 < milli < WHOLE_CARD}
    if not sizes:
        return NO_CLASS
    return sizes.pop() if len(sizes) == 1 else MIXED


def round_up_share(milli: int, sizes: tuple[int, ...] = SHARE_SIZES) -> int:
    """The smallest offered size that holds a share of ``milli`` (a whole card above the largest)."""
    if milli >= WHOLE_CARD or milli <= 0:
        return milli
    return next((size for size in sorted(sizes) if size >= milli), WHOLE_CARD)


@dataclass
class NodeSpec:
    id: object
    cpu_free: int
    memory_free_mb: int
    cards: list[CardSpec] = field(default_factory=list)
    # Where the node sits (a rack or switch label) when the inventory says so: a gang prefers one group.
    group: object = None
    # What people call it (the live node's name), for reasons such as a reservation's; None: its id.
    name: str | None = None
    # GB its tenants' disks may still reserve (a data disk and a system disk each); None: disk is not counted.
    disk_free_gb: int | None = None


class ClusterState:
    """Mutable free capacity; ``take`` and ``give`` keep every array consistent, the cards' classes too.

    ``one_size_per_card``: the product's rule (above). False lets fractions of any sizes share a card, as
    before the rule: only for measuring what the rule costs (bench/share_classes.py) and for reproducing
    published results on free-form fractions.
    """

    def __init__(self, nodes: list[NodeSpec], *, one_size_per_card: bool = True):
        self.one_size_per_card = one_size_per_card
        self.node_ids = [n.id for n in nodes]
        self.node_names = [str(n.id) if n.name is None else n.name for n in nodes]
        self.node_index = {n.id: i for i, n in enumerate(nodes)}
        width = max((len(n.cards) for n in nodes), default=0)
        count = len(nodes)
        self.models: dict[str, int] = {}
        self.cpu_free = np.array([n.cpu_free for n in nodes], dtype=np.int64)
        self.mem_free = np.array([n.memory_free_mb for n in nodes], dtype=np.int64)
        self.disk_free = np.array([UNCOUNTED if n.disk_free_gb is None else n.disk_free_gb for n in nodes], np.int64)
        self.exists = np.zeros((count, width), dtype=bool)
        self.free = np.zeros((count, width), dtype=np.int64)
        self.card_mem_total = np.zeros((count, width), dtype=np.int64)
        self.card_mem_free = np.zeros((count, width), dtype=np.int64)
        self.card_class = np.zeros((count, width), dtype=np.int64)
        self.model = np.full((count, width), ANY_MODEL - 1, dtype=np.int64)
        self.card_ids: list[list[object]] = []
        labels: dict[object, int] = {}
        # Group code per node (-1: no label); gangs keep to one group when one can hold them.
        self.group = np.array([-1 if n.group is None else labels.setdefault(n.group, len(labels)) for n in nodes])
        # A node's version changes whenever its free capacity does: scores cached per node stay valid until then.
        self.version = _new_versions(count)
        self.score_cache: dict = {}
        # Gathered in lists, then set at once: one numpy assignment per card and array took ~8 ms of every live tick
        # (8,000 cards).
        rows, columns, free, memory, memory_free, share_class, model = [], [], [], [], [], [], []
        for i, node in enumerate(nodes):
            self.card_ids.append([c.id for c in node.cards])
            for j, card in enumerate(node.cards):
                rows.append(i)
                columns.append(j)
                free.append(card.free_milli)
                memory.append(card.memory_mb)
                memory_free.append(_memory_free(card))
                share_class.append(_class(card))
                model.append(self.model_code(card.model))
        at = (np.array(rows, dtype=np.intp), np.array(columns, dtype=np.intp))
        self.exists[at] = True
        self.free[at] = free
        self.card_mem_total[at] = memory
        self.card_mem_free[at] = memory_free
        self.card_class[at] = share_class
        self.model[at] = model

    def nodes_set(self, nodes: list[NodeSpec]) -> None:
        """Take the nodes' own free capacity (CPU, memory, disk) and names from ``nodes``: the same nodes, in the same
        order, as this state was built from (their cards are not read: ``card_set``)."""
        if [n.id for n in nodes] != self.node_ids:
            raise ValueError("nodes_set takes the nodes this state holds, in its order")
        self.node_names = [str(n.id) if n.name is None else n.name for n in nodes]
        cpu = np.array([n.cpu_free for n in nodes], dtype=np.int64)
        memory = np.array([n.memory_free_mb for n in nodes], dtype=np.int64)
        disk = np.array([UNCOUNTED if n.disk_free_gb is None else n.disk_free_gb for n in nodes], dtype=np.int64)
        changed = np.flatnonzero((cpu != self.cpu_free) | (memory != self.mem_free) | (disk != self.disk_free))
        self.cpu_free[...], self.mem_free[...], self.disk_free[...] = cpu, memory, disk
        self.version[changed] = _new_versions(changed.size)

    def card_set(self, node: int, column: int, card: CardSpec) -> bool:
        """Take one card's capacity from ``card``: the card at (node row, column), as this state was built. False
        (nothing set) when the card is of another model now: build the state again."""
        if self.card_ids[node][column] != card.id:
            raise ValueError(f"card {card.id} is not at ({node}, {column})")
        if self.model[node, column] != self.model_code(card.model):
            return False
        at = (node, column)
        values = (card.free_milli, card.memory_mb, _memory_free(card), _class(card))
        if values != (self.free[at], self.card_mem_total[at], self.card_mem_free[at], self.card_class[at]):
            self.free[at], self.card_mem_total[at], self.card_mem_free[at], self.card_class[at] = values
            self.version[node] = next(_VERSIONS)
        return True

    # What a placement changes: a scratch copy has its own, the rest is shared.
    CAPACITY = ("cpu_free", "mem_free", "disk_free", "free", "card_mem_free", "card_class", "version")

    def copy(self) -> ClusterState:
        """A scratch copy whose capacity can change without touching this one."""
        other = object.__new__(ClusterState)
        other.__dict__.update(self.__dict__)
        for name in self.CAPACITY:
            setattr(other, name, getattr(self, name).copy())
        other.score_cache = {}
        return other

    def adopt(self, scratch: ClusterState) -> None:
        """Take a scratch copy's capacity as this one's (what was tried on it is kept). This one's scores stay
        valid: a node the copy changed has a version no score of it here was computed at."""
        for name in self.CAPACITY:
            getattr(self, name)[...] = getattr(scratch, name)

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

    def joinable(self, rows, milli: int) -> np.ndarray | bool:
        """Which cards of ``rows`` a share of ``milli`` may join for its size (not counting free share)."""
        return joinable(self.card_class[rows], milli, self.one_size_per_card)

    def take(self, node: int, cards: list[int], milli: int, cpu: int, memory_mb: int, disk_gb: int = 0) -> list[int]:
        """Take capacity; returns the GPU memory taken on each card. A fraction sets its card's class."""
        taken = []
        for card in cards:
            memory = self.memory_for(node, card, milli)
            self.free[node, card] -= milli
            self.card_mem_free[node, card] -= memory
            if milli < WHOLE_CARD and self.card_class[node, card] != MIXED:
                # Without the rule (one_size_per_card False) the class is that of the last fraction: unused.
                self.card_class[node, card] = milli
            taken.append(memory)
        self.cpu_free[node] -= cpu
        self.mem_free[node] -= memory_mb
        self.disk_free[node] -= disk_gb
        self.version[node] = next(_VERSIONS)
        return taken

    def give(self, node: int, cards: list[int], milli: int, cpu: int, memory_mb: int, disk_gb: int = 0) -> None:
        for card in cards:
            self.free[node, card] += milli
            self.card_mem_free[node, card] += self.memory_for(node, card, milli)
            if self.free[node, card] >= WHOLE_CARD:
                self.card_class[node, card] = NO_CLASS
        self.cpu_free[node] += cpu
        self.mem_free[node] += memory_mb
        self.disk_free[node] += disk_gb
        self.version[node] = next(_VERSIONS)

    def allocated_share(self) -> float:
        """Fraction of all GPU capacity allocated (0..1)."""
        total = self.exists.sum() * WHOLE_CARD
        return float((WHOLE_CARD * self.exists - np.where(self.exists, self.free, 0)).sum() / total) if total else 0.0


# Versions are numbered across every state of this process: one number is one node's capacity at one moment, in
# whichever state (or copy of one) it was given, so scores cached at a version may be shared between states.
_VERSIONS = itertools.count()


def _new_versions(count: int) -> np.ndarray:
    return np.fromiter(itertools.islice(_VERSIONS, count), dtype=np.int64, count=count)


def _memory_free(card: CardSpec) -> int:
    return card.memory_mb if card.free_memory_mb is None else card.free_memory_mb


def _class(card: CardSpec) -> int:
    return NO_CLASS if card.free_milli >= WHOLE_CARD else card.share_class


def joinable(card_class, milli: int, one_size_per_card: bool = True):
    """Whether a share of ``milli`` may join cards of ``card_class`` for its size (an array, or True for
    whole cards and where the rule is off): an empty card, or one of the same class."""
    if not one_size_per_card or not 0 < milli < WHOLE_CARD:
        return True
    return (card_class == NO_CLASS) | (card_class == milli)
