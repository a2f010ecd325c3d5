"""Fake CUDA client (``fake-cuda-client``): what a tenant's CUDA process gets from the card, as the
measuring program of ``bench/gpu_check.py`` reported it. Prints one JSON line once it has a context (or
could not get one), then holds it: ``--hold SECONDS`` (default: until ended), ``--grab`` to add the memory
it could take (``grabbed_mb``).

With an MPS control daemon answering on ``$CUDA_MPS_PIPE_DIRECTORY/control`` (default /tmp/nvidia-mps) it
is that daemon's client: the server's limits, lowered (never raised) by its own
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``. With none, it runs without
MPS on device 0 (the first card ``CUDA_VISIBLE_DEVICES`` leaves) if its compute mode lets it have a context:
the whole card, held (in the state directory) until it exits.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import sys
import time

import _cards as cards
from _control import ERR_CONNECT, connect

TERMINATED = "the MPS client has been terminated by the server"  # cudaErrorMpsClientTerminated, runs 1, 2, 5
FAULT = "an illegal memory access was encountered"  # what the other clients of the server got, runs 1, 2
RPC_FAILED = "the remote procedural call between the MPS server and the MPS client failed"  # 806


def _print(record: dict) -> None:
    print(json.dumps(record), flush=True)


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def _hold(sock: socket.socket | None, seconds: float | None) -> int:
    """Waits out ``seconds`` (None: for ever). An MPS client reads its connection meanwhile: the server
    terminating it, faulting it, or going away ends it with the error the measured programs printed."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if sock is None:
            if left is None:
                signal.pause()
                continue
            time.sleep(left)
            return 0
        readable, _, _ = select.select([sock], [], [], left)
        if not readable:
            return 0
        data = sock.recv(4096)
        if not data:
            _print({"error": RPC_FAILED})
            return 1
        for line in data.decode().splitlines():
            event = json.loads(line).get("event")
            if event == "terminated":
                _print({"error": TERMINATED})
                return 1
            if event == "fault":
                _print({"error": FAULT})
                return 1


def _mps(sock: socket.socket, args: argparse.Namespace) -> int:
    hello = {
        "hello": "client",
        "thread_percentage": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
        "memory_limit": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
    }
    sock.sendall(json.dumps(hello).encode() + b"\n")
    reply = b""
    while not reply.endswith(b"\n"):  # waits while the daemon queues it behind another uid's server
        chunk = sock.recv(4096)
        if not chunk:
            _print({"context": False, "error": ERR_CONNECT})
            return 1
        reply += chunk
    answer = json.loads(reply)
    if not answer.get("ok"):
        _print({"context": False, "error": answer.get("error")})
        return 1
    if "device" not in answer:
        _print({"context": False, "error": cards.NO_DEVICE})
        return 1
    card = cards.Card(0, answer["device"], answer["memory_mb"], sms=answer["sms"])
    limit = answer.get("memory_limit_mb")
    record = {
        "context": True,
        "mps": True,
        "thread_percentage": _number(answer["thread_percentage"]),
        "memory_limit_mb": min(limit, card.memory_mb) if limit is not None else card.memory_mb,
        "sm_count": cards.sm_count(card, answer["thread_percentage"]),
        "pid": os.getpid(),
        "server": answer["server"],
        "device": card.uuid,
    }
    if args.grab:
        record["grabbed_mb"] = cards.grabbed_mb(card, limit)
    _print(record)
    return _hold(sock, args.hold)


def _alone(args: argparse.Namespace) -> int:
    """No daemon answered: device 0 (the first card ``CUDA_VISIBLE_DEVICES`` leaves), as the measured
    PyTorch program asked for it, if its compute mode gives this process a context."""
    pid = os.getpid()
    devices = cards.visible(cards.all_cards(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    if not devices:
        _print({"context": False, "error": cards.NO_DEVICE})
        return 1
    chosen = devices[0]
    with cards.card_lock(chosen):
        refused = cards.refuses_context(chosen, pid)
        if not refused:
            cards.hold(chosen, pid)
    if refused:
        _print({"context": False, "error": cards.BUSY})
        return 1
    try:
        record = {
            "context": True,
            "mps": False,
            "thread_percentage": 100,
            "memory_limit_mb": chosen.memory_mb,
            "sm_count": chosen.sms,
            "pid": pid,
            "device": chosen.uuid,
        }
        if args.grab:
            record["grabbed_mb"] = cards.grabbed_mb(chosen, None)
        _print(record)
        return _hold(None, args.hold)
    finally:
        cards.release(chosen, pid)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fake-cuda-client", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hold", type=float, default=None, help="seconds to keep the context (default: for ever)")
    parser.add_argument("--grab", action="store_true", help="report the memory it could allocate")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cards.register("clients")
    try:
        pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
        try:
            sock = connect(os.path.join(pipe, "control"))
        except OSError:
            sock = None  # the man page: no daemon reached, the program runs as it would without MPS
        if sock is None:
            return _alone(args)
        with sock:
            return _mps(sock, args)
    finally:
        cards.unregister("clients")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
