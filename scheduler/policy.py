"""Placement policy: pure Python, no Django, shared by the live tick and the simulator.

Input is plain objects (requests and the free capacity of nodes); output is a
list of placements. Capacity objects are mutated as work is placed so that
one call never hands out the same share twice.

Rules:
- only cards of the requested model; multi-card work is all-or-nothing on one node;
- a fraction goes to the partly used card it fills best (best fit), so whole
  cards stay whole for work that needs them;
- whole cards go to the node that has the fewest free cards left after it
  (best fit at node level), so large free nodes stay free for gang work;
- GPU share, GPU memory, CPU and host memory are checked together.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WHOLE_CARD = 1000


@dataclass
class Card:
    id: object
    model: str
    memory_mb: int
    free_milli: int = WHOLE_CARD
    free_memory_mb: int | None = None

    def __post_init__(self):
        if self.free_memory_mb is None:
            self.free_memory_mb = self.memory_mb

    def memory_for(self, milli: int) -> int:
        """GPU memory that goes with a share of this card (proportional)."""
        return self.memory_mb * milli // WHOLE_CARD

    def fits(self, milli: int) -> bool:
        return self.free_milli >= milli and self.free_memory_mb >= self.memory_for(milli)


@dataclass
class NodeCapacity:
    id: object
    free_cpu: int
    free_memory_mb: int
    cards: list[Card] = field(default_factory=list)


@dataclass
class Request:
    id: object
    gpu_model: str
    gpu_count: int = 1
    gpu_milli: int = WHOLE_CARD
    cpu: int = 0
    memory_mb: int = 0
    pinned_node: object = None


@dataclass
class CardShare:
    card_id: object
    milli: int
    memory_mb: int


@dataclass
class Placement:
    request_id: object
    node_id: object
    shares: list[CardShare]


def choose(request: Request, nodes: list[NodeCapacity]) -> tuple[NodeCapacity, list[Card]] | None:
    """The best node and cards for one request, or None if nothing fits now."""
    best = None
    best_key = None
    for node in nodes:
        if request.pinned_node is not None and node.id != request.pinned_node:
            continue
        if node.free_cpu < request.cpu or node.free_memory_mb < request.memory_mb:
            continue
        fitting = [c for c in node.cards if c.model == request.gpu_model and c.fits(request.gpu_milli)]
        if len(fitting) < request.gpu_count:
            continue
        if request.gpu_milli < WHOLE_CARD:
            card = min(fitting, key=lambda c: (c.free_milli - request.gpu_milli, str(c.id)))
            key = (card.free_milli - request.gpu_milli, 0)
            cards = [card]
        else:
            cards = sorted(fitting, key=lambda c: str(c.id))[: request.gpu_count]
            key = (0, len(fitting) - request.gpu_count)
        if best_key is None or key < best_key:
            best, best_key = (node, cards), key
    return best


def commit(request: Request, node: NodeCapacity, cards: list[Card]) -> Placement:
    """Take the capacity for a chosen placement and describe it."""
    shares = []
    for card in cards:
        memory = card.memory_for(request.gpu_milli)
        card.free_milli -= request.gpu_milli
        card.free_memory_mb -= memory
        shares.append(CardShare(card.id, request.gpu_milli, memory))
    node.free_cpu -= request.cpu
    node.free_memory_mb -= request.memory_mb
    return Placement(request.id, node.id, shares)


def place(requests: list[Request], nodes: list[NodeCapacity]) -> list[Placement]:
    """Place requests in the given order; the ones that do not fit now are skipped."""
    placements = []
    for request in requests:
        chosen = choose(request, nodes)
        if chosen is not None:
            placements.append(commit(request, *chosen))
    return placements
