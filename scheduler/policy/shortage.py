"""Which resource is short when queued work does not fit: cards, or the host's CPU cores, memory or disk.

``decide`` asks this before it says why work waits, so a queued instance reads "the nodes with 0.4 of an
RTX3090 free have too few free CPU cores" when the cards have room, rather than blaming the cards.
"""

from __future__ import annotations

from dataclasses import replace

from scheduler.policy.cluster import WHOLE_CARD, ClusterState
from scheduler.policy.placement import Request, _eligible_cards, _eligible_nodes


def host_shortage(cluster: ClusterState, request: Request) -> str:
    """Why ``request`` does not fit when some node has the cards for it but not its CPU, memory or disk; "" when the
    cards themselves are short (or the request spans several nodes: the caller's own reason stands)."""
    if request.nodes not in (None, 1):
        return ""
    # Nodes with the cards (the pinned one only), whatever their free CPU, memory and disk.
    pinned_only = _eligible_nodes(cluster, replace(request, cpu=0, memory_mb=0, disk_gb=0))
    cards = pinned_only & (_eligible_cards(cluster, request).sum(axis=1) >= request.gpu_count)
    if not cards.any():
        return ""
    cpu = bool((cluster.cpu_free[cards] >= request.cpu).any())
    memory = bool((cluster.mem_free[cards] >= request.memory_mb).any())
    hosts = cards & (cluster.cpu_free >= request.cpu) & (cluster.mem_free >= request.memory_mb)
    if hosts.any() and not (cluster.disk_free[hosts] >= request.disk_gb).any():
        short = "too little free disk for its disks" + (f" ({request.disk_gb} GB)" if request.disk_gb else "")
    elif not cpu and not memory:
        short = "too few free CPU cores and too little free memory"
    elif not cpu:
        short = "too few free CPU cores"
    elif not memory:
        short = "too little free memory"
    else:
        short = "not enough free CPU cores and memory together"
    model = request.gpu_model or "GPU"
    if request.gpu_count == 0:
        return f"the nodes have {short}"
    if request.gpu_milli < WHOLE_CARD:
        where = f"{request.gpu_milli / WHOLE_CARD:g} of a {model} card free"
    else:
        where = f"{request.gpu_count} free {model} card{'s' if request.gpu_count != 1 else ''}"
    return f"the nodes with {where} have {short}"
