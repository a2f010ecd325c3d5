"""Fractions of a card enforced on the host: one MPS control daemon per shared card, limits set server-side.

Why MPS, and this way (the choice issue 18 asked for):

- **Environment variables alone are advice.** ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` in the container can be unset by the tenant, who then has the
  whole card. The limit has to live where the tenant cannot reach it.
- **MIG** is hardware isolation, but only A100/A30/H100/H200-class cards have it, in fixed slices
  (sevenths), and a change of layout needs the card idle. Our fractions (0.1 steps, RTX 3090s as well as
  A100s) do not fit it. It stays a possible later addition for those cards.
- **HAMi-core** (``libvgpu.so`` through ``/etc/ld.so.preload``): the library cannot be dropped, but it
  reads its limits from the container's own environment (``CUDA_DEVICE_MEMORY_LIMIT``…), and a hook in
  the dynamic loader does nothing for a static binary or a process that loads the driver itself
  (``dlmopen``, direct ioctls). It also has to follow every new driver API.
- **MPS** lets several processes share one card at once and limits each client *in the MPS server*:
  active thread percentage (the SMs it may use) and pinned device memory. Two details make it hold:

  1. the card is put in ``EXCLUSIVE_PROCESS`` compute mode, so the MPS server is the only process that
     can hold a context on it: a tenant who unsets or redirects ``CUDA_MPS_PIPE_DIRECTORY`` gets "all
     CUDA-capable devices are busy or unavailable", not the whole card;
  2. limits are per *client* on the server side. Legacy MPS (protocol 2) keeps limits per *server*,
     and servers are per Linux user (all containers are root), with servers of different users run one
     after the other — so per-tenant limits need MPS v3 (``-p 3``, driver r615+): each server has
     *namespaces*, each with its own pinned memory limit and active thread percentage, and a client is in
     the namespace whose socket it connects to. The daemon is started with a configuration file
     (``-a``) holding one namespace per share size (``s050`` … ``s950``, a client limit each: a share
     of 0.4 connects to ``s400`` — 40 % of the SMs and 40 % of the card's memory); a container gets only
     its namespace's socket directory, read-only, at the default pipe path ``/tmp/nvidia-mps`` and in
     ``CUDA_MPS_PIPE_DIRECTORY``, so unsetting the variable changes nothing and no other namespace (or
     the daemon's control socket, which could change limits) is reachable from inside.

A card is in MPS mode only while it holds fractions: a whole-card launch takes the daemon down and puts
the card back in ``DEFAULT`` mode (the scheduler never places a whole card beside a fraction). Shares
round down to the namespace step (below one step, one step). ``bench/gpu_check.sh`` checks all of this
on a real card; its two 0.5 shares share the namespace ``s500``, so it also shows that a namespace's
limits hold per client (each near half the card) rather than for its clients together (if they did, a
namespace per container, made with the daemon's ``namespace`` commands at launch, would replace the
per-size ones).
Not covered: a container running several CUDA processes (each process is a client, each limited to the
share), and copy-engine bandwidth.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from django.conf import settings

from scheduler.policy.cluster import WHOLE_CARD

CLIENT_PIPE_PATH = "/tmp/nvidia-mps"  # the driver's default pipe directory: where a client looks without the variable
SERVER = "card"
STEP = 50  # thousandths of a card between namespaces
EXCLUSIVE, DEFAULT = "EXCLUSIVE_PROCESS", "DEFAULT"


class MpsError(Exception):
    """The card's MPS daemon could not be started or stopped; says which card and what the tool answered."""


def enabled(node) -> bool:
    """Whether this node enforces fractions through MPS: GPU_SHARE_ENFORCE "mps", or "auto" on real cards."""
    mode = settings.GPU_SHARE_ENFORCE
    return mode == "mps" or (mode == "auto" and not node.simulated)


def namespace(milli: int) -> str:
    """The namespace a share connects to: its share rounded down to STEP (at least one STEP)."""
    return f"s{max(STEP, milli // STEP * STEP):03d}"


def client_limits(milli: int, card_memory_mb: int) -> tuple[int, int]:
    """(active thread percentage, pinned device memory in MB) that the server allows one client of ``milli``."""
    share = max(STEP, milli // STEP * STEP)
    return max(1, share * 100 // WHOLE_CARD), card_memory_mb * share // WHOLE_CARD


def card_dirs(uuid: str) -> tuple[Path, Path]:
    """(pipe directory, log directory) of the card's daemon on the host."""
    base = Path(settings.MPS_DIR) / uuid
    return base / "pipe", base / "log"


def card_config(uuid: str, card_memory_mb: int) -> str:
    """The daemon's MPS v3 configuration (TOML): one server on this card, one namespace per share size."""
    lines = ['schema_version = "1.0"', "", f"[servers.{SERVER}]", f'allowed_devices = "{uuid}"', "uid = 0"]
    for milli in range(STEP, WHOLE_CARD, STEP):
        percent, memory_mb = client_limits(milli, card_memory_mb)
        lines += [
            "",
            f"[servers.{SERVER}.namespaces.{namespace(milli)}]",
            f'pinned_memory_limit = "{memory_mb}M"',
            f'active_thread_percentage = "{percent}"',
        ]
    return "\n".join(lines) + "\n"


def _environment(uuid: str) -> dict:
    pipe, logs = card_dirs(uuid)
    return {**os.environ, "CUDA_VISIBLE_DEVICES": uuid, "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(logs)}  # fmt: skip


def _run(command: list[str], uuid: str) -> None:
    try:
        result = subprocess.run(command, env=_environment(uuid), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MpsError(f"card {uuid}: {command[0]} did not run: {exc}") from exc
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip().splitlines()
        raise MpsError(f"card {uuid}: {' '.join(command[:3])} failed: {said[-1] if said else result.returncode}")


def daemon_running(uuid: str) -> bool:
    """The daemon's pid file (it writes one into its pipe directory) names a live process."""
    pid_file = card_dirs(uuid)[0] / "nvidia-cuda-mps-control.pid"
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return False
    return Path(f"/proc/{pid}").exists()


def card_ensure(uuid: str, card_memory_mb: int) -> None:
    """The card is in EXCLUSIVE_PROCESS mode with its MPS daemon running (started here if it is not)."""
    if daemon_running(uuid):
        return
    pipe, logs = card_dirs(uuid)
    pipe.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    config = pipe.parent / "mps.toml"
    config.write_text(card_config(uuid, card_memory_mb))
    _run([settings.NVIDIA_SMI, "-i", uuid, "-c", EXCLUSIVE], uuid)
    _run([settings.MPS_CONTROL, "-d", "-p", "3", "-a", str(config)], uuid)


def card_release(uuid: str) -> None:
    """Stop the card's daemon (if any) and give the card back its DEFAULT compute mode, for a whole-card launch."""
    if daemon_running(uuid):
        _run([settings.MPS_CONTROL, "-q"], uuid)
    if card_dirs(uuid)[0].parent.exists():
        _run([settings.NVIDIA_SMI, "-i", uuid, "-c", DEFAULT], uuid)


def cards_prepare(node, shares) -> None:
    """Before a launch on ``node``: a fraction gets its card's daemon, a whole card a card without one."""
    if not enabled(node):
        return
    for share in shares:
        if share.milli < WHOLE_CARD:
            card_ensure(share.uuid, share.card_memory_mb)
        else:
            card_release(share.uuid)


def client_spec(node, shares) -> tuple[dict, dict]:
    """(volumes, environment) for a container holding ``shares``: for a fraction, its namespace's sockets
    only, read-only, at the default pipe path; nothing for whole cards or where MPS is not enforced."""
    if not (shares and shares[0].milli < WHOLE_CARD and enabled(node)):
        return {}, {}
    pipe = card_dirs(shares[0].uuid)[0] / SERVER / namespace(shares[0].milli)
    return {str(pipe): {"bind": CLIENT_PIPE_PATH, "mode": "ro"}}, {"CUDA_MPS_PIPE_DIRECTORY": CLIENT_PIPE_PATH}
