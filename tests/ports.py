"""A free loopback port for a server that a test, a bench or a smoke starts in another process.

Asking the kernel (``bind(("127.0.0.1", 0))``) gives a port from its ephemeral range, the range every outgoing
connection's local port is drawn from too. Between the probe and the server's own ``bind`` (the seconds a
process takes to start), a connection made by anything else on the machine may take that port, and the server
fails with "Address already in use" (a CI run's WebSocket server did, beside two other smokes). So the port is
drawn at random from below that range, where no outgoing connection is ever given one, and kept only if nothing
is bound to it: checked without ``SO_REUSEPORT``, since daphne's processes share their port that way and a port
in their use would look free to a probe that set it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_draw = random.SystemRandom()  # not the seeded module functions: pytest-randomly gives every xdist worker one seed
LOWEST = 20000  # above the usual services' ports (PostgreSQL 5432, Redis 6379, run.sh's 8000 and 8001)
HIGHEST = 29499  # the highest port of a pair: below the gangs' rendezvous ports (GANG_PORT_MIN 29500, torchrun's)
RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default where it cannot be read)."""
    try:
        low, high = RANGE_FILE.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, pair: bool = False) -> int:
    """A port nothing is bound to, below the ephemeral range and the gangs' ports (and the next one free too,
    with ``pair``)."""
    low, high = ephemeral_range()
    below = range(LOWEST, min(HIGHEST, low - 1))  # a pair's second port at most HIGHEST, below the range
    above = range(high + 1, 65535 - 1)
    candidates = below or above
    for _ in range(200):
        port = _draw.choice(candidates) if candidates else _kernel_port()
        if port < 65535 and all(bindable(p) for p in ([port, port + 1] if pair else [port])):
            return port
    raise OSError("no free loopback port found in 200 tries")


def _kernel_port() -> int:
    """Where the ephemeral range leaves no room around it: the kernel's choice, as before."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
