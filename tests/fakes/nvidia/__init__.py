"""Fake NVIDIA tools for tests without a GPU, modelled on driver r580.159.04 as measured on an H200
(``docs/gpu-check/2026-12-04-run*.jsonl``, "run1".."run6" below) and on NVIDIA's documentation (the MPS
guide, docs.nvidia.com/deploy/mps; the ``nvidia-cuda-mps-control`` and ``nvidia-smi`` man pages). Nothing
here accepts an option or command the real tools would not.

Standard-library Python 3 scripts (``#!/usr/bin/env python3``), for the system ``python3``. The helpers
below put ``<state>/bin`` first on ``PATH``: links to the three tools here and to ``/usr/bin/python3``, so
that ``env`` finds the plain interpreter before a version manager's shim (pyenv's costs 0.2 s a call).

- ``nvidia-smi`` (``_smi.py``): ``-i <index|UUID|bus id>``, ``-c <DEFAULT|0|PROHIBITED|2|EXCLUSIVE_PROCESS|3>``,
  ``--query-gpu=... --format=csv[,noheader][,nounits]``, ``-L``.
- ``nvidia-cuda-mps-control`` (``_control.py``, ``_daemon.py``): ``-h``, ``-d``, ``-f``, ``-M``, ``-q``; the
  daemon, its servers (real processes named ``nvidia-cuda-mps-server``) and the front-end reading commands
  on standard input.
- ``fake-cuda-client`` (``_client.py``): stands in for a tenant's CUDA process (``--hold SECONDS``, ``--grab``);
  prints one JSON line: ``{"context": true, "mps": true, "thread_percentage": 25, "memory_limit_mb": 35942,
  "sm_count": 32, "pid": .., "server": .., "device": "GPU-..", "grabbed_mb": 35328}``, or an ``error``.

Declared cards: ``FAKE_NVIDIA_CARDS="GPU-<uuid>:<MiB>[:<name>[:<SMs>]],..."`` (name "NVIDIA H200", 132
SMs unless given), else the ``declared`` file of ``FAKE_NVIDIA_STATE``, the state directory (compute modes,
who holds each card, the fakes that run: see ``_cards.py``). The fixture ``fake_nvidia``, imported into a
``conftest.py`` (``from tests.fakes.nvidia import fake_nvidia  # noqa: F401``), or ``installed(monkeypatch,
cards)`` for a fixture of one's own::

    def test_something(fake_nvidia):  # PATH, FAKE_NVIDIA_STATE, FAKE_NVIDIA_CARDS set; all ended after
        pipe = fake_nvidia.pipe("card0")
        fake_nvidia.daemon(pipe)                                   # nvidia-cuda-mps-control -d
        fake_nvidia.control(pipe, "set_default_active_thread_percentage 25")
        tenant = fake_nvidia.client(pipe, hold=5)                  # a Popen; .stdout's first line is JSON

``FakeNvidia(cards)`` is the same without pytest's environment (``.env`` to pass on, ``.stop()`` to end
it). ``CARDS`` are run1's and run2's H200s.

What is measured, and where
---------------------------
- ``nvidia-cuda-mps-control -h``: the usage text of run2, whole. An unknown option (``-p 3 -a x.toml``, MPS
  "v3") prints it and exits 0, starting nothing (``agent/mps.py``'s notes of the r580 check).
- The pipe directory holds ``control`` (0666), ``control_lock``, ``control_privileged`` (0755), ``log`` (a FIFO
  here) and ``nvidia-cuda-mps-control.pid`` (every run's ``daemon`` step; the modes of a real one in a public listing).
  ``control.log`` lines read ``[2026-12-04 15:39:47.719 Control   823] Cmd:get_server_list``, then the answer
  and ``UI closed`` (run1, run2 ``control_log_tail``).
- Answers, status 0 for all of them (every ``raw``/``said``): ``get_server_list`` empty with no server; ``ps``
  "Server not found" with no server, empty with a server and no client (run1 root/dir/ps), else run2's table
  (client pid, client id, server pid, the card UUID's first 22 characters, the client's PID-namespace inode,
  the first word of its command line); ``get_default_active_thread_percentage`` "25.0";
  ``get_default_device_pinned_mem_limit 0`` "35G" for 35942M, "70G" for 71885M; ``set_default_*``
  answers "25.0" / nothing; ``set_active_thread_percentage S 100`` "100.0"; ``terminate_client`` "0";
  ``Unknown command "no_such_command"``; ``Server 690 not found``; ``start_server -uid 0`` nothing.
- Who may do what (run1 ``control_from_a_tenant``: root and nobody through the whole directory and
  through ``control`` alone; run2 the same with a client; run5 a nobody server without -M; run6 with -M):
  ``set_default_*`` and ``quit`` only through ``control_privileged``, which root reaches when the socket is in
  its view (else "Insufficient privileges for UID 0. Control deamon settings can only be modified by the
  user who started it or by the root user." / "Not enough privilege to execute quit command");
  ``set_active_thread_percentage``, ``set_device_pinned_mem_limit``, ``terminate_client`` on a server: root
  and the server's own uid, any other uid refused (``terminate_client``'s refusal ends with "800");
  a server that does not exist: "Server <pid> not found" before any privilege check; reads: anyone.
- No daemon: "Cannot find MPS control daemon process", status 1 (the man page: non-zero when the daemon is
  not found). A second ``-d`` on the same pipe: "An instance of this daemon is already running", status 0.
- Servers: started by the first client or ``start_server`` with the defaults of that moment, which later
  ``set_default_*`` do not change (run2: default 25.0 while server 861 stayed at its own 100.0); a server
  outlives its clients (run1, run3 ``eager_server``); without -M it runs as its first client's uid (run5:
  owner 65534), with -M as root (run6: owner 0).
- Clients: a client's own ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` lower
  the server's limits, never raise them (run2 ``environment``: asked 100 % and the card, got 32 SMs and
  35,328 MiB); SMs = 132 x percentage rounded down to even (66 at 50 %, 32 at 25 %); ``grabbed_mb`` = the
  limit less 512 MiB in 512-MiB blocks (71,885 -> 71,168; 35,942 -> 35,328), the whole idle card less its
  615 MiB used alike (142,336). ``terminate_client``: that client gets "the MPS client has been terminated by
  the server", every other client of the server "an illegal memory access was encountered" (runs 1 and 2,
  XID 31); a SIGKILLed client just leaves ``ps`` (run2 ``sigkill``).
- No daemon reachable (``CUDA_MPS_PIPE_DIRECTORY`` pointing nowhere): a card in EXCLUSIVE_PROCESS held by a
  server, even one with no client, gives no context: "CUDA-capable device(s) is/are busy or unavailable"
  (run1 ``bypass``, run3/run4 ``eager_server``); a free card is had whole, 132 SMs (run2 ``bypass``, ``alone``).
- ``nvidia-smi``: ``compute_mode`` reads Default / Exclusive_Process (``card``, ``daemon`` steps), driver
  580.159.04, "NVIDIA H200", 143771 MiB, MIG Disabled, "CUDA Version: 13.0". The ``-c`` messages ("Set compute
  mode to ... for GPU 00000000:XX:00.0." / "Compute mode is already set to ..." + "All done."; as non-root
  "Unable to set the compute mode for GPU ...: Insufficient Permissions" + "Terminating early due to
  previous errors.", status 4) are r5xx outputs quoted in public issues; status codes are the man page's
  (2 invalid argument, 4 no permission, 6 not found, 9 no driver).

From the documentation, not measured
------------------------------------
- ``quit`` waits for the clients to end (``quit -t S``: for S seconds, then forces), stops the servers, and
  returns once the daemon is gone; the daemon removes ``control``, ``control_privileged`` and the pid file.
- A client of another uid than the running server's (no -M) waits until that server has no client left;
  the daemon then replaces the server with one of the new uid (the MPS guide: requests of other users are
  queued; the man page). It is not refused with 805 (run4's 805 for uid 65534 was not explained).
- After ``terminate_client`` the server is in FAULT (``get_server_status``) until every client it had has
  exited; meanwhile new clients are refused with "MPS server is not ready to accept new MPS client
  requests" (807); then ACTIVE again (the MPS guide, error containment).
- ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, ``CUDA_MPS_CLIENT_PRIORITY`` in
  the daemon's own environment set its defaults; ``CUDA_VISIBLE_DEVICES`` (indexes, UUIDs or their first
  characters) picks its devices, device 0 its first.
- A client that reaches no daemon asks for device 0 (the first card ``CUDA_VISIBLE_DEVICES`` leaves; the
  measured program was PyTorch on ``cuda:0``): a context unless the card is PROHIBITED, or EXCLUSIVE_PROCESS
  with another process holding it; it holds the card until it exits.

Guessed (neither measured nor documented; the strings are the r535 binary's where it has one)
--------------------------------------------------------------------------------------------
- When the binary's other messages are printed: "Invalid percentage, expected between (0.0, 100.0]",
  "Invalid device ordinal!", "No default pinned memory limit set for the device!", "A user id (UID) is
  required to start a new server", "A server PID is required", "Invalid process <pid>!" (``terminate_client``
  of a pid that is not the server's client), "Invalid priority value - must be 0 or 1!", "Only root user may
  enable -multiuser-server!" (``-M`` as non-root, r555).
- ``start_server`` needs ``control_privileged`` like the defaults do (measured only through it); with a
  server of that uid already there it starts nothing. ``Unknown command "..."`` quotes the whole line
  (measured with one word). ``get_server_status`` prints the bare state. A non-root daemon starts servers
  for its own uid only; others' clients get 805.
- Invented wording: a bad memory value, a server with no pinned limit, ``start_server`` while another uid's
  server has clients, ``nvidia-smi -c 1`` (refused: NVML dropped EXCLUSIVE_THREAD), an unknown nvidia-smi
  option or query field, nvidia-smi's table (only its version line is measured). PCI bus ids are an HGX
  board's. A client is given at least 2 SMs, and no more memory than the card has.

Not modelled
------------
- ``get_device_client_list`` and ``device_query`` answer "fake ...: not modelled" (their output was never
  measured); ``shutdown_server`` is not in r580's usage and is an unknown command here.
- What a client computes: no kernels, no memory use (``nvidia-smi`` always shows 615 MiB used), no rates, no
  per-process NVML data, no priorities. Memory is not shared out among processes using a card without MPS.
  Under MPS, a client's ``CUDA_VISIBLE_DEVICES`` is ignored (the guide says not to set it).
- Servers are ``cat`` processes named ``nvidia-cuda-mps-server`` run as their uid: no /dev/shm, no
  ``server.log`` beyond connects, disconnects and faults, not in ``nvidia-smi``. One server per daemon (one
  uid at a time, or root's with -M); 48-client limits, MIG, MPS "v3" (``-p 3``), static partitioning: absent.
- The wire protocol between the fakes is their own (JSON lines over the same sockets); a real CUDA program
  cannot talk to the fake daemon, nor ``fake-cuda-client`` to a real one. A pipe path over 107 bytes works
  here (real behaviour with one was not measured).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import _cards

BIN = Path(__file__).resolve().parent
TOOLS = ("nvidia-smi", "nvidia-cuda-mps-control", "fake-cuda-client")
SYSTEM_PYTHON = Path("/usr/bin/python3")
H200_MB = 143_771
# run1's and run2's cards
CARDS = ("GPU-5deb25d2-a49b-8878-e1c3-e8b31d9fa6a6:143771", "GPU-c403ac2a-214d-c866-6d23-8bf16101d27f:143771")
NOBODY = 65534


def as_user(uid: int | None) -> list[str]:
    """argv prefix running a command as ``uid`` (and its gid; no supplementary groups)."""
    if uid is None:
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


class FakeNvidia:
    """Declared cards, a state directory (world-readable, in ``/tmp``: clients run as other uids) and
    helpers that run the fakes. ``stop()`` ends every fake client and daemon it started or that
    registered in its state directory (their servers go with the daemons), and removes the directory."""

    def __init__(self, cards: tuple[str, ...] | list[str] = CARDS, monkeypatch: pytest.MonkeyPatch | None = None):
        self.state = Path(tempfile.mkdtemp(prefix="fake-nvidia-"))
        self._monkeypatch = monkeypatch
        self._processes: list[subprocess.Popen] = []
        try:
            self.state.chmod(0o755)
            self.bin = self.state / "bin"
            self.bin.mkdir()
            for name in TOOLS:
                (self.bin / name).symlink_to(BIN / name)
            if os.access(SYSTEM_PYTHON, os.X_OK):
                (self.bin / "python3").symlink_to(SYSTEM_PYTHON)
            self.declare(cards)
        except BaseException:
            shutil.rmtree(self.state, ignore_errors=True)
            raise

    def declare(self, cards: tuple[str, ...] | list[str]) -> None:
        """The cards every fake sees from now on (``GPU-<uuid>:<MiB>[:<name>[:<SMs>]]``)."""
        self.cards = _cards.parse_cards(",".join(cards))
        self.spec = ",".join(card.spec() for card in self.cards)
        (self.state / "declared").write_text(self.spec.replace(",", "\n") + "\n")
        with _environment({"FAKE_NVIDIA_STATE": str(self.state)}):  # made by root: clients run as others
            for card in self.cards:
                _cards.card_dir(card)
        for kind in ("daemons", "clients"):
            (self.state / kind).mkdir(exist_ok=True)
            (self.state / kind).chmod(0o1777)
        if self._monkeypatch is not None:
            self._monkeypatch.setenv("FAKE_NVIDIA_CARDS", self.spec)

    @property
    def uuids(self) -> list[str]:
        return [card.uuid for card in self.cards]

    @property
    def env(self) -> dict[str, str]:
        """What puts the fakes in place: ``PATH`` (``<state>/bin`` first), ``FAKE_NVIDIA_STATE``,
        ``FAKE_NVIDIA_CARDS``."""
        path = os.environ.get("PATH", "/usr/bin:/bin")
        if not path.startswith(f"{self.bin}:"):
            path = f"{self.bin}:{path}"
        return {"PATH": path, "FAKE_NVIDIA_STATE": str(self.state), "FAKE_NVIDIA_CARDS": self.spec}

    def pipe(self, name: str = "mps") -> Path:
        """A daemon's directory ``<state>/<name>`` with ``pipe/`` and ``log/`` in it; returns ``pipe/``
        (``log_of(pipe)`` is its log directory)."""
        base = self.state / name
        for sub in ("pipe", "log"):
            (base / sub).mkdir(parents=True, exist_ok=True)
            (base / sub).chmod(0o755)
        base.chmod(0o755)
        return base / "pipe"

    @staticmethod
    def log_of(pipe: Path) -> Path:
        return pipe.parent / "log"

    def environ(self, pipe: Path | str | None = None, env: dict | None = None) -> dict[str, str]:
        """The process environment for a fake: this one's, the fakes', ``CUDA_MPS_PIPE_DIRECTORY`` and
        ``CUDA_MPS_LOG_DIRECTORY`` for ``pipe`` (a pipe of ``pipe()``), then ``env`` (a None value unsets)."""
        merged = {**os.environ, **self.env}
        if pipe is not None:
            merged["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe)
            if Path(pipe).parent.joinpath("log").is_dir():
                merged["CUDA_MPS_LOG_DIRECTORY"] = str(Path(pipe).parent / "log")
        for key, value in (env or {}).items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = str(value)
        return merged

    def run(
        self,
        argv: list[str],
        *,
        pipe: Path | str | None = None,
        stdin: str | None = None,
        user: int | None = None,
        env: dict | None = None,
        timeout: float = 30,
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*as_user(user), *argv],
            input=stdin,
            env=self.environ(pipe, env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd="/",
        )

    def control(self, pipe: Path | str, commands: str, **kw) -> subprocess.CompletedProcess:
        """``commands`` (one a line) to ``nvidia-cuda-mps-control`` on standard input, as the real tool
        takes them."""
        return self.run(["nvidia-cuda-mps-control"], pipe=pipe, stdin=commands.rstrip("\n") + "\n", **kw)

    def ask(self, pipe: Path | str, command: str, **kw) -> str:
        """One command's answer (stdout, stripped)."""
        return self.control(pipe, command, **kw).stdout.strip()

    def daemon(
        self, pipe: Path | str, *, multiuser: bool = False, visible: str | None = None, env: dict | None = None
    ) -> subprocess.CompletedProcess:
        """``nvidia-cuda-mps-control -d [-M]`` for ``pipe``, its devices ``visible`` (``CUDA_VISIBLE_DEVICES``,
        by default the first card's UUID, as the agent does)."""
        extra = {"CUDA_VISIBLE_DEVICES": visible if visible is not None else self.cards[0].uuid, **(env or {})}
        return self.run(["nvidia-cuda-mps-control", "-d", *(["-M"] if multiuser else [])], pipe=pipe, env=extra)

    def client(
        self,
        pipe: Path | str | None = None,
        *,
        hold: float | None = 30,
        grab: bool = False,
        user: int | None = None,
        env: dict | None = None,
    ) -> subprocess.Popen:
        """A ``fake-cuda-client`` (Popen, text stdout) using the daemon of ``pipe`` (None: the default
        pipe path ``/tmp/nvidia-mps``, which a test should not count on). Read its first line with
        ``first_line``. Ended at ``stop()`` if still running."""
        argv = [*as_user(user), "fake-cuda-client"]
        if hold is not None:
            argv += ["--hold", str(hold)]
        if grab:
            argv.append("--grab")
        variables = dict(env or {})
        if pipe is None:
            variables.setdefault("CUDA_MPS_PIPE_DIRECTORY", None)
        process = subprocess.Popen(
            argv, env=self.environ(pipe, variables), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/"
        )
        self._processes.append(process)
        return process

    def compute_mode(self, uuid: str) -> str:
        card = next(c for c in self.cards if c.uuid == uuid)
        with _environment(self.env):
            return _cards.compute_mode(card)

    def holders(self, uuid: str) -> list[int]:
        """Processes holding a context on the card (MPS servers, clients without MPS)."""
        card = next(c for c in self.cards if c.uuid == uuid)
        with _environment(self.env):
            return _cards.holders(card)

    def daemons(self) -> list[int]:
        return _cards.registered(self.state, "daemons")

    def stop(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                process.kill()
        for pid in _cards.registered(self.state, "clients"):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        daemons = self.daemons()
        for pid in daemons:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while self.daemons() and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in self.daemons():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for process in self._processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.communicate(timeout=5)
        shutil.rmtree(self.state, ignore_errors=True)


def first_line(process: subprocess.Popen) -> dict:
    """The JSON line a ``fake-cuda-client`` prints first (once it has a context, or could not get one)."""
    line = process.stdout.readline()
    if not line:
        process.wait(10)
        raise AssertionError(f"fake-cuda-client printed nothing (status {process.returncode}): {process.stderr.read()}")
    return json.loads(line)


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def installed(monkeypatch: pytest.MonkeyPatch, cards: tuple[str, ...] | list[str] = CARDS) -> Iterator[FakeNvidia]:
    """The fakes first on ``PATH``, ``FAKE_NVIDIA_STATE`` and ``FAKE_NVIDIA_CARDS`` set (through
    ``monkeypatch``, so for this process and whatever it starts); on leaving, every fake daemon, server
    and client ended. For a fixture of one's own::

        @pytest.fixture
        def nvidia(monkeypatch):
            with installed(monkeypatch, ["GPU-...:81920:NVIDIA A100-SXM4-80GB"]) as fake:
                yield fake
    """
    fake = FakeNvidia(cards, monkeypatch)
    for key, value in fake.env.items():
        monkeypatch.setenv(key, value)
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def fake_nvidia(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvidia]:
    """``installed`` with ``CARDS`` (two H200s; change them with ``.declare()``). Import it into a
    ``conftest.py`` (importing it into a test module trips ruff's F811)."""
    with installed(monkeypatch) as fake:
        yield fake
