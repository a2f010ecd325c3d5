"""Processes that must outlive the node agent: each shared card's MPS control daemon and the shared-storage
client (the JuiceFS mount behind every instance's ``/root/autodl-fs``).

Restarting or upgrading the agent must not end a fractional tenant's MPS server or unmount its files.
How they are kept apart from the agent depends on how the agent runs (``HOST_SERVICES``):

- ``process`` (a bare-metal agent, ``make run``, the several-host setup, CI): each detaches itself from
  the agent — ``nvidia-cuda-mps-control -d`` and ``juicefs mount --background`` fork a daemon that init
  adopts — so it is in no process group, session or service of the agent's;
  ``tests/faults/test_host_services.py`` kills the agent with SIGKILL, starts it again and finds both
  still serving.
- ``containers`` (the agent itself in a container, ``docker-compose.node.yml``): a process the agent
  starts lives in the agent container's cgroup and is killed with it, so each runs in a container of its
  own, from the agent's image, started and watched by the agent through the host's Docker engine and
  restarted by Docker (``unless-stopped``) — the pattern NVIDIA's Kubernetes device plugin uses for its
  MPS daemon (a container of its own, in the host's PID namespace). The MPS daemon gets the card through
  the NVIDIA Container Toolkit (``compute,utility`` brings ``nvidia-cuda-mps-control`` and the server),
  the card's folder under ``MPS_DIR`` at the same path, the host's PID namespace (the daemon and its
  server find their clients by host pid); it runs in the foreground (``-f``), so Docker sees it. Not yet
  run on a GPU host (README, "Not yet run on real hardware").
"""

from __future__ import annotations

import dataclasses

import docker
from django.conf import settings

from agent import launcher, mps
from agent.labels import LABEL


def mps_container_name(uuid: str) -> str:
    return f"gpucloud-mps-{settings.DEPLOYMENT_ID}-{uuid.removeprefix('GPU-')}"


def mps_container_spec(card: mps.Card) -> dict:
    """The arguments of ``containers.run`` for the card's daemon in a container of its own: the card
    through the toolkit as a tenant gets it (``launcher.gpu_request``, on the real card the daemon serves)."""
    gpu_env, requests = launcher.gpu_request(_RealCard(), [card.uuid])
    return {
        "image": settings.HOST_SERVICE_IMAGE,
        "command": [card.host.control, "-f", *(["-M"] if card.host.multiuser else [])],
        "name": mps_container_name(card.uuid),
        "detach": True,
        "environment": {
            **gpu_env,
            "CUDA_VISIBLE_DEVICES": card.uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(card.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(card.logs),
        },
        "device_requests": requests,
        "volumes": {str(card.base): {"bind": str(card.base), "mode": "rw"}},
        "pid_mode": "host",
        "restart_policy": {"Name": "unless-stopped"},
        "labels": {
            f"{LABEL}.service": "mps",
            f"{LABEL}.gpus": card.uuid,
            f"{LABEL}.deployment": settings.DEPLOYMENT_ID,
        },
    }


class _RealCard:
    """What ``gpu_request`` asks of a node: the daemon runs only on hosts with real cards and the toolkit."""

    nvidia_runtime, simulated = True, False


def mps_container_start(card: mps.Card) -> None:
    """Start the card's daemon container unless it runs (a stopped one is replaced)."""
    client = launcher.docker_client()
    try:
        existing = client.containers.get(mps_container_name(card.uuid))
    except docker.errors.NotFound:
        existing = None
    if existing is not None:
        if existing.status == "running":
            return
        existing.remove(force=True)
    client.containers.run(**mps_container_spec(card))


def mps_container_stop(card: mps.Card) -> None:
    """Remove the card's daemon container (its daemon was asked to quit first): Docker must not restart it."""
    try:
        launcher.docker_client().containers.get(mps_container_name(card.uuid)).remove(force=True)
    except docker.errors.NotFound:
        pass


def mps_host() -> mps.MpsHost:
    """This host's MPS daemons, started the way ``HOST_SERVICES`` says."""
    host = mps.host_from_settings()
    if settings.HOST_SERVICES == "containers":
        return dataclasses.replace(host, start=mps_container_start, stopped=mps_container_stop)
    return host
