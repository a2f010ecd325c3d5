"""Fractions of a card enforced on the host: one classic MPS control daemon per shared card, its limits
set server-side, one share size per card.

What the driver has (r535–r580, measured on an H200 with r580: ``../shared/GPU.md``; NVIDIA's MPS guide
and the ``nvidia-cuda-mps-control`` man page):

- **One control daemon per card**, each with its own pipe directory (``CUDA_MPS_PIPE_DIRECTORY``) and
  ``CUDA_VISIBLE_DEVICES=<card UUID>``; the card in ``EXCLUSIVE_PROCESS`` compute mode, so its MPS
  server is the only process that can hold a context there: a process that does not come through the
  daemon's pipe gets no context at all (measured), rather than the whole card.
- **Limits are the server's, for every client alike**: ``set_default_active_thread_percentage`` and
  ``set_default_device_pinned_mem_limit`` on the control pipe apply to servers started afterwards (so
  they are set before the first client starts the card's server). A client's own
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` can lower them, never
  raise them (measured: asked 100 % / 100 GB under 60 % / 40 GB defaults, got 40 GB and 0.74x).
  There are no per-client namespaces (MPS "v3", ``-p 3 -a <toml>``, is not in these drivers: r580's
  tool printed its usage and exited 0, leaving the card exclusive with no daemon).
- So **a card serves one share size at a time** (its *class*): the first fraction placed on an empty
  card sets it (the scheduler's rule, ``scheduler.policy``), the daemon is configured for it (a 0.25
  share: 25 % of the SMs and a quarter of the card's memory per client), and a card of another class
  is reconfigured only once its daemon has no client left.
- **One CUDA process per fractional container**: the limits hold per *client process*, so four
  processes of a 0.25 share would take the whole card. ``agent.mps_watch`` reads the daemon's client
  list (``ps``) every second, finds each client's container by its cgroup, and SIGKILLs a container's
  newer client. Not ``terminate_client``: on the H200 it faulted every client of the card's server
  (XID 31, "illegal memory access" in the other tenants), while SIGKILL of the process left the others
  running (``docs/gpu-check/2026-12-04-run2.jsonl``).
- **What a tenant reaches**: the daemon's ``control`` socket alone, read-only, at the driver's default
  pipe path ``/tmp/nvidia-mps`` (unsetting ``CUDA_MPS_PIPE_DIRECTORY`` changes nothing). Not the pipe
  directory: through ``control_privileged`` a root tenant quit the daemon and set its defaults. Through
  ``control`` the daemon refuses its defaults and ``quit`` to everyone, but lets root and the uid that
  owns a server change that server's limits and end its clients (measured). So the daemon runs
  multi-user (``-M``: one server owned by root for clients of every uid, started by the agent before
  any tenant), and tenants must not be root on the host: on real cards fractions need a user-namespaced
  engine (Docker's ``userns-remap``), under which a tenant was refused all of it (run 6). Where the
  engine is not, a fractional launch fails saying so (``MPS_REQUIRE_USERNS``).
- **The card is held before any tenant runs**: the agent starts the card's server (``start_server
  -uid 0``) once the limits are set; a process pointed away from the pipe then gets no context even
  with no client connected (measured), where it would otherwise take the whole exclusive card and lock
  the MPS server out.

The control pipe answers a rejected command on stdout with status 0 (status is non-zero only when no
daemon answers), and ``-d`` exits 0 whatever it did: nothing here trusts an exit status alone. A card
is never left in ``EXCLUSIVE_PROCESS`` without a daemon answering on its pipe: a start that cannot be
proven puts the card back to ``DEFAULT`` and fails the launch with a reason naming the card.

This module imports nothing of Django (``bench/gpu_check.py`` runs it on a bare GPU machine); the
agent's settings come in through :func:`host_from_settings`.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.policy.cluster import WHOLE_CARD  # Django-free, as this module is (bench/gpu_check.py)

CLIENT_PIPE_PATH = "/tmp/nvidia-mps"  # where a client looks with no variable: the container's view goes there
EXCLUSIVE, DEFAULT = "EXCLUSIVE_PROCESS", "DEFAULT"
START_S = 10.0  # how long a started daemon has to answer on its pipe
# What the control daemon prints for a command it refused (its status is 0 all the same).
REFUSED = re.compile(r"unknown command|invalid|not found|insufficient|not enough privilege|cannot|error", re.I)


class MpsError(Exception):
    """The card's MPS daemon could not be started, configured or stopped; says which card and what the
    tool answered."""


class NoDaemon(MpsError):
    """No MPS control daemon answers on the card's pipe."""


@dataclass(frozen=True)
class MpsHost:
    """Where this host keeps its cards' daemons and which NVIDIA tools it runs."""

    root: Path
    control: str = "nvidia-cuda-mps-control"
    smi: str = "nvidia-smi"
    env: dict = field(default_factory=dict)  # extra environment for the tools (tests: the fakes' state)
    multiuser: bool = True  # one root-owned server for clients of every uid (-M)
    # How a card's daemon is started and ended where it must not be the agent's child
    # (agent.hostservices: a container of its own); None: ``-d`` (it detaches itself) and ``quit``.
    start: Callable[[Card], None] | None = None
    stopped: Callable[[Card], None] | None = None

    def card(self, uuid: str) -> Card:
        return Card(self, uuid)


@dataclass(frozen=True)
class Limits:
    """What the card's server gives each client of a share of ``milli`` thousandths."""

    thread_percentage: int
    memory_mb: int

    @classmethod
    def of(cls, milli: int, card_memory_mb: int) -> Limits:
        return cls(max(1, milli * 100 // WHOLE_CARD), card_memory_mb * milli // WHOLE_CARD)


@dataclass(frozen=True)
class Card:
    host: MpsHost
    uuid: str

    @property
    def base(self) -> Path:
        return self.host.root / self.uuid

    @property
    def pipe(self) -> Path:
        """The daemon's pipe directory: its control sockets, its log FIFO, its pid file."""
        return self.base / "pipe"

    @property
    def logs(self) -> Path:
        return self.base / "log"

    @property
    def class_file(self) -> Path:
        """The share size (thousandths) the daemon was configured for, written once it was."""
        return self.base / "class"

    def _env(self) -> dict:
        return {**os.environ, **self.host.env, "CUDA_VISIBLE_DEVICES": self.uuid,
                "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe), "CUDA_MPS_LOG_DIRECTORY": str(self.logs)}  # fmt: skip

    def _run(
        self, argv: list[str], stdin: str | None = None, timeout: float = 60, detach: bool = False
    ) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(
                argv,
                input=stdin,
                env=self._env(),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                start_new_session=detach,  # the daemon in no session or process group of the agent's
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"card {self.uuid}: {argv[0]} did not run: {exc}") from exc

    def ask(self, command: str, timeout: float = 30) -> str:
        """One command on the daemon's control pipe; its answer. Raises if no daemon answers or it refused."""
        result = self._run([self.host.control], stdin=command + "\n", timeout=timeout)
        said = (result.stdout + result.stderr).strip()
        if result.returncode != 0:
            raise NoDaemon(f"card {self.uuid}: no MPS daemon answers on {self.pipe} ({said or result.returncode})")
        if REFUSED.search(result.stdout):
            raise MpsError(f"card {self.uuid}: the MPS daemon refused {command.split()[0]!r}: {said}")
        return result.stdout.strip()

    def answers(self) -> bool:
        """The daemon answers on its control pipe (``get_server_list``): the proof that it runs."""
        if not (self.pipe / "control").exists():
            return False
        try:
            self.ask("get_server_list", timeout=10)
        except MpsError:
            return False
        return True

    def configured_class(self) -> int | None:
        try:
            return int(self.class_file.read_text())
        except (OSError, ValueError):
            return None

    def servers(self) -> list[int]:
        return [int(word) for word in self.ask("get_server_list").split() if word.isdigit()]

    def compute_mode(self, mode: str) -> None:
        result = self._run([self.host.smi, "-i", self.uuid, "-c", mode])
        if result.returncode != 0:
            said = (result.stdout + result.stderr).strip().splitlines()
            raise MpsError(f"card {self.uuid}: nvidia-smi -c {mode} failed: {said[-1] if said else result.returncode}")

    def ensure(self, milli: int, card_memory_mb: int) -> None:
        """The card is exclusive, its daemon answers and is configured for shares of ``milli``.

        A daemon of another class is restarted only once it has no client left: its server keeps the
        limits it started with (it outlives its clients), and ``set_default_*`` reaches only servers
        started later, so the daemon is quit and started again with the new class."""
        if self.answers():
            if self.configured_class() == milli:
                return
            if self.clients():  # a server outlives its clients; its clients are what must have ended
                raise MpsError(
                    f"card {self.uuid} serves shares of {self.configured_class() or '?'}/1000 and still has "
                    f"clients: a share of {milli}/1000 waits until they end"
                )
            self.stop()
        self.base.mkdir(parents=True, exist_ok=True)
        self.pipe.mkdir(exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self.class_file.unlink(missing_ok=True)
        self.compute_mode(EXCLUSIVE)
        try:
            if self.host.start is not None:
                self.host.start(self)
                started = subprocess.CompletedProcess([], 0, "", "")
            else:
                started = self._run([self.host.control, "-d", *(["-M"] if self.host.multiuser else [])], detach=True)
            deadline = time.monotonic() + START_S
            while not self.answers():
                if time.monotonic() > deadline:
                    said = (started.stdout + started.stderr).strip().splitlines()
                    raise MpsError(
                        f"card {self.uuid}: the MPS control daemon did not start "
                        f"({said[-1] if said else 'no answer on ' + str(self.pipe)})"
                    )
                time.sleep(0.1)
            limits = Limits.of(milli, card_memory_mb)
            # Device 0: the daemon sees only this card (CUDA_VISIBLE_DEVICES).
            self.ask(f"set_default_active_thread_percentage {limits.thread_percentage}")
            self.ask(f"set_default_device_pinned_mem_limit 0 {limits.memory_mb}M")
            self.server_ensure()
        except MpsError:
            self._quit_quietly()
            self.compute_mode(DEFAULT)  # never exclusive without a daemon
            raise
        self.class_file.write_text(str(milli))

    def server_ensure(self) -> int:
        """The card's server runs (started as root if it does not): it holds the card before any tenant."""
        deadline = time.monotonic() + START_S
        servers = self.servers()
        if not servers:
            self.ask("start_server -uid 0")
        while not servers:
            if time.monotonic() > deadline:
                raise MpsError(f"card {self.uuid}: the MPS server did not start")
            time.sleep(0.1)
            servers = self.servers()
        return servers[0]

    def stop(self) -> None:
        """Quit the daemon (its servers go with it); raise if it is still there afterwards."""
        if not self.answers():
            if self.host.stopped is not None:
                self.host.stopped(self)
            return
        if self.host.stopped is not None:
            self.host.stopped(self)  # its container removed: Docker would start a daemon that quit again
        else:
            self.ask("quit", timeout=60)
        deadline = time.monotonic() + START_S
        while self.answers():
            if time.monotonic() > deadline:
                raise MpsError(f"card {self.uuid}: the MPS control daemon did not quit")
            time.sleep(0.1)
        self.class_file.unlink(missing_ok=True)

    def _quit_quietly(self) -> None:
        try:
            self.stop()
        except MpsError:
            pass

    def release(self) -> None:
        """For a whole-card launch: no daemon, and the card back in ``DEFAULT`` mode once it is gone."""
        self.stop()
        if self.base.exists():
            self.compute_mode(DEFAULT)

    def clients(self) -> list[Client]:
        """The daemon's clients (``ps``), empty if no daemon answers."""
        try:
            return parse_ps(self.ask("ps"))
        except NoDaemon:
            return []
        except MpsError as exc:
            if "Server not found" in str(exc):  # no server yet: no client either
                return []
            raise


@dataclass(frozen=True)
class Client:
    pid: int  # in the daemon's PID namespace: the host's
    server: int
    namespace: str = ""  # the client's PID namespace (inode): one per container


def parse_ps(text: str) -> list[Client]:
    """``ps``'s table, as r580 prints it: a header naming its columns (``PID ID SERVER DEVICE NAMESPACE
    COMMAND``), then a row per client."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = [word.upper() for word in lines[0]]
    if "PID" not in header or "SERVER" not in header:
        return []
    pid, server = header.index("PID"), header.index("SERVER")
    namespace = header.index("NAMESPACE") if "NAMESPACE" in header else None
    return [
        Client(int(row[pid]), int(row[server]), row[namespace] if namespace is not None else "")
        for row in lines[1:]
        if len(row) > max(pid, server, namespace or 0) and row[pid].isdigit() and row[server].isdigit()
    ]


def host_from_settings() -> MpsHost:
    from django.conf import settings

    return MpsHost(Path(settings.MPS_DIR), settings.MPS_CONTROL, settings.NVIDIA_SMI)


def enabled(node) -> bool:
    """Whether this node enforces fractions through MPS: GPU_SHARE_ENFORCE "mps", or "auto" on real cards."""
    from django.conf import settings

    mode = settings.GPU_SHARE_ENFORCE
    return mode == "mps" or (mode == "auto" and not node.simulated)


def userns_problem(engine: dict) -> str | None:
    """Why tenants of this engine would be root on the host (None if its containers are user-namespaced)."""
    if any("name=userns" in option for option in engine.get("SecurityOptions") or ()):
        return None
    return (
        "fractions of a card need the host's Docker engine to run containers in a user namespace "
        "(userns-remap): a tenant that is root on the host can raise its card's MPS limits and end other "
        "tenants' processes (README, 'Fractions on a real GPU host')"
    )


def cards_prepare(node, shares, *, engine=None, host: MpsHost | None = None) -> None:
    """Before a launch on ``node``: a fraction gets its card's daemon for its class, a whole card a card
    without one. ``engine``: a callable giving the engine's ``docker info``, checked on real cards."""
    from django.conf import settings

    if not enabled(node):
        return
    fraction = any(share.milli < WHOLE_CARD for share in shares)
    if fraction and not node.simulated and settings.MPS_REQUIRE_USERNS and engine is not None:
        problem = userns_problem(engine())
        if problem:
            raise MpsError(problem)
    host = host or host_from_settings()
    for share in shares:
        card = host.card(share.uuid)
        if share.milli < WHOLE_CARD:
            card.ensure(share.milli, share.card_memory_mb)
        else:
            card.release()


def client_spec(node, shares) -> tuple[dict, dict]:
    """(volumes, environment) for a container holding ``shares``: for a fraction, its card daemon's
    ``control`` socket alone, read-only, at the driver's default pipe path (so unsetting the variable
    changes nothing); nothing for whole cards or where MPS is not enforced. The container keeps its own
    ``/dev/shm``: a client needs none of the server's (measured)."""
    if not (shares and shares[0].milli < WHOLE_CARD and enabled(node)):
        return {}, {}
    control = host_from_settings().card(shares[0].uuid).pipe / "control"
    volumes = {str(control): {"bind": f"{CLIENT_PIPE_PATH}/control", "mode": "ro"}}
    return volumes, {"CUDA_MPS_PIPE_DIRECTORY": CLIENT_PIPE_PATH}
