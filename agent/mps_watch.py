"""Every second, on each shared card of this host: its MPS server runs, and each container holds one CUDA
process there at most.

The card's limits hold per client *process* (``agent/mps.py``), so a 0.25 share that starts a second CUDA
process would hold two quarters. The daemon's ``ps`` lists its clients with their host pids; each pid's
cgroup names its container (``agent.telemetry.cgroups``), and a container's clients beyond its oldest are
SIGKILLed, after a line on the process's own stderr (which is the container's: Docker keeps it in the
work's log) saying why. SIGKILL, not ``terminate_client``: on the H200 the latter faulted every client of
the card's server, other tenants' too, where a SIGKILL left them running (docs/gpu-check, run 2). An
overuse therefore lasts at most one interval (``MPS_WATCH_S``, 1 s) plus the kill; the kill itself took
under 0.1 s there.

A server that is gone (a fault in one client ends every client and its server) is started again at once,
so the card stays held by MPS and a process that skips the pipe cannot take it whole.
"""

from __future__ import annotations

import logging
import os
import signal
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from agent import mps
from agent.telemetry.cgroups import PROC, container_of_pid

log = logging.getLogger(__name__)


def _started(pid: int, proc: Path) -> int:
    """The process's start time (clock ticks since boot); later processes are the extra ones."""
    try:
        return int((proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 1 << 62


class MpsWatch:
    def __init__(
        self,
        host: mps.MpsHost,
        *,
        container_of: Callable[[int], str | None] | None = None,
        kill: Callable[[int, int], None] = os.kill,
        proc: Path = PROC,
    ):
        self.host, self.kill, self.proc = host, kill, proc
        self.container_of = container_of or (lambda pid: container_of_pid(pid, proc=proc))

    def cards(self) -> list[mps.Card]:
        """The cards whose daemon this host configured (a class file in their folder)."""
        if not self.host.root.is_dir():
            return []
        return [self.host.card(d.name) for d in sorted(self.host.root.iterdir()) if (d / "class").exists()]

    def step(self) -> list[mps.Client]:
        """One pass over the cards; the clients it stopped."""
        stopped = []
        for card in self.cards():
            try:
                stopped += self._card(card)
            except mps.MpsError as exc:
                log.warning("MPS watch: %s", exc)
        return stopped

    def _card(self, card: mps.Card) -> list[mps.Client]:
        try:
            card.server_ensure()
        except mps.NoDaemon:
            return []  # no daemon: nothing shares this card (the next fraction's launch starts one)
        by_container: dict[str, list[mps.Client]] = defaultdict(list)
        for client in card.clients():
            container = self.container_of(client.pid)
            if container:  # a host process (the agent's own check, an operator) is not a tenant
                by_container[container].append(client)
        extra = []
        for container, clients in by_container.items():
            clients.sort(key=lambda c: (_started(c.pid, self.proc), c.pid))
            for client in clients[1:]:
                self._stop(card, client, container)
                extra.append(client)
        return extra

    def _stop(self, card: mps.Card, client: mps.Client, container: str) -> None:
        share = card.configured_class() or 0
        note = (
            f"gpucloud: process {client.pid} was stopped: a {share / 1000:g} share of a card runs one CUDA "
            "process at a time (its limits hold per process); use one process, or whole cards for several\n"
        )
        try:
            with open(self.proc / str(client.pid) / "fd" / "2", "a") as stderr:  # the container's own stream
                stderr.write(note)
        except OSError:
            pass
        log.warning("card %s: stopping client %s of container %s (one CUDA process per share)",
                    card.uuid, client.pid, container)  # fmt: skip
        try:
            self.kill(client.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def run_forever(self, stop, interval: float) -> None:
        while not stop.wait(interval):
            try:
                self.step()
            except Exception:  # one bad pass must not end the watch
                log.exception("MPS watch pass failed")
