"""The free loopback port a test, bench or smoke gives a server it starts (tests/ports.py): outside the range the
kernel draws outgoing connections' local ports from, and not one a running server shares with SO_REUSEPORT."""

import random
import socket

from tests import ports


def test_ports_are_drawn_below_the_kernels_ephemeral_range_and_the_gangs_rendezvous_ports():
    low, high = ports.ephemeral_range()
    drawn = [ports.free_port(pair=True) for _ in range(200)]
    assert all(ports.LOWEST <= port and port + 1 < min(low, 29500) for port in drawn), (low, sorted(drawn)[-3:])


def test_the_ephemeral_range_is_the_kernels(tmp_path, monkeypatch):
    with socket.socket() as probe:  # the kernel's own choice of a port lies in the range read
        probe.bind(("127.0.0.1", 0))
        low, high = ports.ephemeral_range()
        assert low <= probe.getsockname()[1] <= high
    monkeypatch.setattr(ports, "RANGE_FILE", tmp_path / "missing")
    assert ports.ephemeral_range() == (32768, 60999)  # Linux's default where the file cannot be read


def test_a_port_daphne_shares_with_so_reuseport_is_not_free(monkeypatch):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        taken = listener.getsockname()[1]
        assert not ports.bindable(taken)
        spare = ports.free_port(pair=True)
        draws = iter([taken, taken - 1, spare])  # the port itself, then the one before it as a pair's first
        monkeypatch.setattr(ports._draw, "choice", lambda candidates: next(draws))
        assert ports.free_port(pair=True) == spare
    finally:
        listener.close()


def test_the_draw_is_not_the_seeded_one_pytest_randomly_gives_every_worker():
    random.seed(1)
    first = [ports.free_port() for _ in range(3)]
    random.seed(1)
    assert [ports.free_port() for _ in range(3)] != first
