"""The WebSocket server: several daphne processes on one port.

One daphne is one event loop: every frame to every socket it holds is sent by it, one after
the other (autobahn frames each in Python), so 1,000 viewers of a sample wait for one
process to write 1,000 frames. Several processes share that work: each gets a listening
socket of its own on the same port (``SO_REUSEPORT``: the kernel spreads new connections
over them) and serves it with ``daphne --fd``. The rest of the command line goes to each
daphne as it is; SIGTERM / SIGINT go to them all, and when one exits the others are stopped.

    python -m config.websocket_server [--processes N] -b 127.0.0.1 -p 8001 [daphne options] config.asgi:application

``--processes`` defaults to ``WS_PROCESSES``, else the number of cores (at most 4).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys


def listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def default_processes() -> int:
    return int(os.environ.get("WS_PROCESSES") or min(os.cpu_count() or 1, 4))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=None)
    parser.add_argument("-b", "--bind", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=8001)
    args, daphne_args = parser.parse_known_args(argv)
    processes = args.processes or default_processes()
    if processes < 1:
        parser.error(f"--processes must be at least 1, not {processes}")
    sockets = [listening_socket(args.bind, args.port) for _ in range(processes)]
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "daphne", "--fd", str(sock.fileno()), *daphne_args], pass_fds=[sock.fileno()]
        )
        for sock in sockets
    ]
    for sock in sockets:
        sock.close()  # the children hold them

    def stop(signum, frame):
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    pid, status = os.wait()  # the first to exit (a crash, or the stop above) ends the server
    stop(None, None)
    for child in children:
        child.wait()
    return os.waitstatus_to_exitcode(status) if pid else 1


if __name__ == "__main__":
    sys.exit(main())
