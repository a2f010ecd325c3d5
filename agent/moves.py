"""A node agent's part in moving a stopped instance between hosts (``scheduler.services.moves`` leads).

On the source: ``agent_move_export`` commits the instance's container (its
system disk) and pushes it to the registry; its relay serves the data disk
(``relay/volume.py``). On the target: ``agent_move_import`` pulls the system
disk, makes the data disk and fills it from the source's relay through a
helper container, counting and hashing what arrives and reporting progress.
``agent_move_cleanup`` removes the copy that is not the instance's any more:
the source's once the move is done, the target's when it failed. Only objects
labelled with this node are removed, so two hosts sharing one engine (tests)
never touch each other's copy.

Every step reports to the control plane (``ToScheduler.MOVE_REPORT``); an
error is reported with the host's name and what it was doing.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
import time

import docker
from django.conf import settings
from django.db.models import Q

from agent import disks, launcher
from core.messages import ToScheduler, send
from core.relay import Op, relay_base
from core.relay_tls import relay_http
from scheduler.models import Move, MoveStatus, Node, Workload
from scheduler.services.moves import move_snapshot_ref

log = logging.getLogger(__name__)
CHUNK = 1024 * 1024
CLEANED = {"source": MoveStatus.DONE, "target": MoveStatus.FAILED}  # whose copy goes once the move ended how


def _report(move_id: int, **fields) -> None:
    send(ToScheduler.MOVE_REPORT, move_id, fields)


def _copying(move_id: int) -> Move | None:
    move = Move.objects.select_related("workload", "source", "target").filter(pk=move_id).first()
    return move if move is not None and move.status == MoveStatus.COPYING else None


def agent_move_export(move_id: int) -> None:
    move = _copying(move_id)
    if move is None:
        return
    workload = move.workload
    try:
        if launcher.containers_on_node(move.source.name).get(workload.uid) is None:
            _report(move_id, phase="done", nothing_to_copy=True)  # never ran here: no disk to copy
            return
        ref = move_snapshot_ref(move)
        launcher.container_commit(workload, ref)
        launcher.image_push(ref)
        launcher.image_remove(ref)  # the container keeps its disk here until the move is done
    except Exception as exc:  # Docker, the registry: the move fails saying where and why
        _report(move_id, error=f"{move.source.name} could not save the system disk: {_short(exc)}")
        return
    _report(
        move_id,
        phase="copying the data disk",
        snapshot_ref=ref,
        bytes_total=disks.disk_used_bytes(workload.volume_name),
        exported=True,
    )


def agent_move_import(move_id: int, capability: str) -> None:
    """``capability``: the control plane's VOLUME ticket for this move (the source's relay takes nothing else)."""
    move = _copying(move_id)
    if move is None:
        return
    workload = move.workload
    helper = None
    try:
        launcher.image_pull(move.snapshot_ref)
        launcher.data_volume_ensure(workload, node_name=move.target.name)
        helper = launcher.docker_client().containers.create(
            move.snapshot_ref,
            ["true"],
            name=f"gpucloud-move-{workload.uid}-{move.pk}",
            volumes={workload.volume_name: {"bind": settings.INSTANCE_DATA_PATH, "mode": "rw"}},
            network_mode="none",
            labels={f"{launcher.LABEL}.deployment": settings.DEPLOYMENT_ID, f"{launcher.LABEL}.move": str(move.pk)},
        )
        received, digest = _fetch_into(move, helper.id, capability)
    except Exception as exc:  # the source's relay, Docker, the network: this host's partial copy goes
        log.warning("move %s into %s failed: %s", move_id, move.target.name, exc)
        _report(move_id, error=f"{move.target.name} could not receive the disks: {_short(exc)}")
        return
    finally:
        if helper is not None:
            launcher.container_delete(helper.name)
    _report(move_id, phase="checking", received_sha256=digest, bytes_received=received)


def _fetch_into(move: Move, helper_id: str, capability: str) -> tuple[int, str]:
    """Stream the source's data disk into the helper's mount of the new one; (bytes, SHA-256) of the stream."""
    source = move.source
    if not source.relay_url:
        raise RuntimeError(f"{source.name} has no relay registered")
    # ValueError: not its own address, or TLS without its certificate's fingerprint
    base = relay_base(
        node=source.name, address=source.address, relay_url=source.relay_url, tls_sha256=source.relay_tls_sha256
    )
    headers = {"Authorization": f"Bearer {capability}"}
    url = f"{base}/v1/{Op.VOLUME}"
    digest, counted = hashlib.sha256(), 0
    with relay_http(source.relay_tls_sha256).get(url, headers=headers, stream=True, timeout=(5, 60)) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{move.source.name}'s relay answered {response.status_code}: {response.text[:150]}")

        def chunks():
            nonlocal counted
            reported = time.monotonic()
            for chunk in response.iter_content(CHUNK):
                digest.update(chunk)
                counted += len(chunk)
                if time.monotonic() - reported > settings.MOVE_PROGRESS_S:
                    _report(move.pk, bytes_received=counted)
                    reported = time.monotonic()
                yield chunk

        parent = posixpath.dirname(settings.INSTANCE_DATA_PATH.rstrip("/"))
        if not launcher.docker_client().api.put_archive(helper_id, parent, chunks()):
            raise RuntimeError("Docker did not unpack the data disk")
    return counted, digest.hexdigest()


def agent_move_cleanup(move_id: int, side: str) -> None:
    """Remove this host's copy of a moved instance: ``side`` "source" after success, "target" after failure.

    The message's word is not enough (it may be redelivered, or forged by another host): only a move
    that ended so (``CLEANED``) has a copy to remove, and never one the instance holds now (``_holds``).
    """
    move = Move.objects.select_related("workload", "source", "target").filter(pk=move_id).first()
    if move is None or CLEANED.get(side) != move.status:
        log.warning("move %s cleanup of its %s refused: the move is %s", move_id, side, move and move.status)
        return
    node = move.source if side == "source" else move.target
    workload = move.workload
    if _holds(workload, node):
        return  # the instance lives here after all (it moved back, or is moving from or to here)
    state = launcher.containers_on_node(node.name).get(workload.uid)
    if state is not None:
        launcher.container_delete(state.name)
    volume = launcher.volumes_on_node(node.name).get(workload.uid)
    if volume is not None:
        launcher.volume_delete(volume)
    # The source pushed its snapshot and let go of it at once; its own card-change snapshot goes now. The
    # target let go of the snapshot it pulled.
    ref = f"{launcher.SNAPSHOT_REPOSITORY}:{workload.uid}" if side == "source" else move.snapshot_ref
    if ref:
        _remove_quietly(ref)


def _holds(workload: Workload, node: Node) -> bool:
    """Whether ``node`` has the instance's disk now: it runs or is pinned there, or a move copies from or to it."""
    if node.pk in (workload.node_id, workload.pinned_node_id):
        return True
    copying = Move.objects.filter(workload=workload, status=MoveStatus.COPYING)
    return copying.filter(Q(source=node) | Q(target=node)).exists()


def _remove_quietly(ref: str) -> None:
    try:
        launcher.image_remove(ref)
    except docker.errors.APIError as exc:  # still used by a container here: it stays
        log.info("image %s kept: %s", ref, exc)


def _short(exc: Exception) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return (text.splitlines() or [type(exc).__name__])[0][:180]
