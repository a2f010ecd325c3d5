"""The node's slow queue (``node.<name>.slow``): a Celery worker process of its own, started and watched
by the node agent.

What takes minutes or hours (``core.messages.SLOW``: image pulls, commits and pushes, removals, disk
growth, moves) runs here, never on the agent's threads, so one tenant's hour-long commit cannot hold
back a stop, a launch or a restart. The worker uses Celery's prefork pool: each task runs in a child
process that the pool kills at the task's hard time limit (threads cannot be killed, so a thread pool
ignores time limits), after a soft limit at which the task still answers that it ran out of time.

The worker is a child of the agent: it gets the agent's environment (its database role, its Docker
engine), dies with it (``PR_SET_PDEATHSIG``), is started again if it exits, and is stopped when the
agent stops (a cold shutdown: its tasks are delivered again to the next worker, ``acks_late``).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import signal
import subprocess
import sys
import threading

from django.conf import settings

from core.messages import node_queue

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1
RESTART_PAUSE_S = 5


def worker_args(*, queue: str, name: str, pool: str, concurrency: int) -> list[str]:
    """A node worker's arguments to ``celery``: the agent's own (threads) and its slow queue's (prefork)."""
    return [
        "worker",
        "-Q",
        queue,
        "-n",
        name,
        "--pool",
        pool,
        "--concurrency",
        str(concurrency),
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
    ]


def worker_command(node_name: str, concurrency: int) -> list[str]:
    queue, name = node_queue(node_name, slow=True), f"{node_name}-slow@%h"
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "agent.celery",
        *worker_args(queue=queue, name=name, pool="prefork", concurrency=concurrency),
    ]


def _die_with_parent(parent: int) -> None:
    """In the child, before exec: the kernel sends it SIGQUIT (a cold shutdown) when the agent dies.

    Linux sends it when the *thread* that started the child ends: ``run_forever``'s, which lives as
    long as the agent. An agent that died between the fork and this call sends nothing: then the child
    has another parent already (``parent`` is the agent's pid, taken before the fork) and ends here."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGQUIT)
    if os.getppid() != parent:
        os._exit(1)


class SlowWorker:
    """The slow queue's worker process of node ``node_name``; ``run_forever`` keeps one running."""

    def __init__(self, node_name: str, *, concurrency: int, stdout=None, env: dict | None = None):
        self.command = worker_command(node_name, concurrency)
        self.stdout, self.env = stdout, env
        self.process: subprocess.Popen | None = None

    def start(self) -> subprocess.Popen:
        self.process = subprocess.Popen(
            self.command,
            cwd=settings.BASE_DIR,
            stdout=self.stdout,
            stderr=subprocess.STDOUT if self.stdout is not None else None,
            env=self.env,
            preexec_fn=functools.partial(_die_with_parent, os.getpid()),
        )
        return self.process

    def run_forever(self, stop: threading.Event) -> None:
        """Start the worker, and start it again whenever it exits, until ``stop``; then stop it."""
        try:
            while not stop.is_set():
                process = self.start()
                while process.poll() is None and not stop.wait(1):
                    pass
                if not stop.is_set():
                    log.error("the slow queue's worker exited with %s; starting it again", process.returncode)
                    stop.wait(RESTART_PAUSE_S)
        finally:
            self.stop()

    def stop(self, timeout: float = 20) -> None:
        """A cold shutdown (SIGQUIT: running tasks are killed and delivered again later), then SIGKILL."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGQUIT)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
