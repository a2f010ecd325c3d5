"""Moving a stopped instance to another host: the control plane's side (the agents' side: tests/cluster/)."""

import time
from datetime import timedelta

import pytest

from core.clock import db_now
from core.errors import Conflict
from core.messages import ToNode
from core.relay import VOLUME_TICKET_S, Op, ticket_open
from scheduler.models import Move, MoveStatus, Node, NodeStatus, WorkloadStatus
from scheduler.services.moves import move_report, move_snapshot_ref, moves_stalled_fail, workload_move
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db
S = WorkloadStatus


@pytest.fixture
def hosts(settings):
    settings.REGISTRY = "127.0.0.1:5999"  # names the registry; nothing here talks to it
    return make_node("sim:2xRTX3090"), make_node("sim:4xRTX3090"), make_node("sim:4xA100-80GB")


def sent_to(callbacks, monkeypatch):
    """The node tasks sent after commit, as (task, args, node)."""
    sent = []
    monkeypatch.setattr("core.messages.send", lambda task, *args, node=None, **kw: sent.append((task, args, node)))
    for callback in callbacks:
        callback()
    return sent


def test_a_stopped_instance_moves_to_the_host_of_its_type_with_most_free_cards(
    user, hosts, django_capture_on_commit_callbacks, monkeypatch
):
    source, roomy, other_type = hosts
    w = workload(user, status=S.STOPPED, node=source)

    with django_capture_on_commit_callbacks() as callbacks:
        move = workload_move(w)

    w.refresh_from_db()
    assert w.status == S.MOVING and move.source == source and move.target == roomy
    assert sent_to(callbacks, monkeypatch) == [(ToNode.MOVE_EXPORT, (move.pk,), source.name)]


def test_matching_checksums_finish_the_move_on_the_target_and_the_source_cleans_up(
    user, hosts, django_capture_on_commit_callbacks, monkeypatch
):
    source, target, _ = hosts
    w = workload(user, status=S.STOPPED, node=source)
    move = workload_move(w, target=target)
    monkeypatch.setattr("scheduler.registry.manifest_delete", lambda name: True)

    snapshot = move_snapshot_ref(move)
    Node.objects.filter(pk=target.pk).update(address="10.0.0.12")  # the target's registered address
    with django_capture_on_commit_callbacks() as callbacks:
        move_report(move.pk, {"snapshot_ref": snapshot, "exported": True, "bytes_total": 10})
    task, (move_id, capability), to = sent_to(callbacks, monkeypatch)[-1]
    assert (task, move_id, to) == (ToNode.MOVE_IMPORT, move.pk, target.name)
    # The target reads the source's disk with a ticket the control plane signed for this move (a host cannot
    # make one): good for a while the import may wait in the target's queue, not for ever.
    ticket, expires = ticket_open(capability)
    assert (ticket.op, ticket.move, ticket.workload, ticket.user) == (Op.VOLUME, move.pk, w.pk, user.pk)
    assert ticket.peer == "10.0.0.12"  # used from there only
    assert ticket.container == w.container_name
    assert time.time() + VOLUME_TICKET_S - 5 < expires <= time.time() + VOLUME_TICKET_S
    with django_capture_on_commit_callbacks() as callbacks:
        move_report(move.pk, {"sent_sha256": "ab" * 32, "bytes_sent": 10})
        move_report(move.pk, {"received_sha256": "ab" * 32, "bytes_received": 10})

    w.refresh_from_db()
    move.refresh_from_db()
    assert move.status == MoveStatus.DONE and move.bytes_done == 10
    assert w.status == S.STOPPED and w.pinned_node == target and w.node is None
    assert w.image_ref == snapshot and f"to {target.name}" in w.status_reason
    assert (ToNode.MOVE_CLEANUP, (move.pk, "source"), source.name) in sent_to(callbacks, monkeypatch)


def test_different_checksums_fail_the_move_and_the_instance_stays_where_it_was(
    user, hosts, django_capture_on_commit_callbacks, monkeypatch
):
    source, target, _ = hosts
    w = workload(user, status=S.STOPPED, node=source, image_ref="gpucloud/busybox-standin:latest")
    move = workload_move(w, target=target)
    monkeypatch.setattr("scheduler.registry.manifest_delete", lambda name: True)

    with django_capture_on_commit_callbacks() as callbacks:
        move_report(move.pk, {"sent_sha256": "ab" * 32})
        move_report(move.pk, {"received_sha256": "cd" * 32})

    w.refresh_from_db()
    assert Move.objects.get().status == MoveStatus.FAILED
    assert w.status == S.STOPPED and w.node == source and w.image_ref == "gpucloud/busybox-standin:latest"
    assert "checksums differ" in w.status_reason and f"stays on {source.name}" in w.status_reason
    assert (ToNode.MOVE_CLEANUP, (move.pk, "target"), target.name) in sent_to(callbacks, monkeypatch)


def test_a_snapshot_reported_anywhere_but_the_moves_own_fails_the_move_and_is_not_deleted(
    user, hosts, django_capture_on_commit_callbacks, monkeypatch
):
    source, target, _ = hosts
    w = workload(user, status=S.STOPPED, node=source, image_ref="gpucloud/busybox-standin:latest")
    move = workload_move(w, target=target)
    deleted = []
    monkeypatch.setattr("scheduler.registry.manifest_delete", deleted.append)
    theirs = "127.0.0.1:5999/gpucloud-saved:someone-elses"  # reported by any host: every host can sign one

    with django_capture_on_commit_callbacks(execute=True):
        move_report(move.pk, {"snapshot_ref": theirs, "exported": True})
        move_report(move.pk, {"sent_sha256": "ab" * 32, "received_sha256": "ab" * 32})

    w.refresh_from_db()
    move.refresh_from_db()
    assert move.status == MoveStatus.FAILED and "not the move's" in move.error and move.snapshot_ref == ""
    assert w.status == S.STOPPED and w.image_ref == "gpucloud/busybox-standin:latest" and deleted == []


def test_a_move_without_progress_fails_after_the_stall_time(user, hosts, settings):
    source, target, _ = hosts
    w = workload(user, status=S.STOPPED, node=source)
    move = workload_move(w, target=target)
    assert moves_stalled_fail() == []
    Move.objects.filter(pk=move.pk).update(updated_at=db_now() - timedelta(seconds=settings.MOVE_STALL_S + 1))

    assert moves_stalled_fail() == [move.pk]
    w.refresh_from_db()
    assert w.status == S.STOPPED and "no progress" in w.status_reason


def test_what_cannot_move_is_refused_saying_why(user, hosts, settings):
    source, target, _ = hosts
    with pytest.raises(Conflict, match="only a stopped instance"):
        workload_move(workload(user, status=S.RUNNING, node=source), target=target)
    with pytest.raises(Conflict, match="only instances"):
        workload_move(workload(user, kind="job", status=S.STOPPED, node=source))
    with pytest.raises(Conflict, match="no other active host has 1 × H100"):
        workload_move(workload(user, status=S.STOPPED, node=source, gpu_model="H100"))
    Node.objects.filter(pk=source.pk).update(status=NodeStatus.LOST)
    with pytest.raises(Conflict, match="its disk cannot be copied"):
        workload_move(workload(user, status=S.STOPPED, node=source))
    settings.REGISTRY = ""
    with pytest.raises(Conflict, match="needs the platform's image registry"):
        workload_move(workload(user, status=S.STOPPED, node=target))


def test_a_move_goes_only_where_the_instances_disks_fit(user, settings):
    """The copy reserves the disks on the target from the start: a host without room for them is passed over
    when the target is chosen, and refused when named."""
    settings.REGISTRY, settings.INSTANCE_SYSTEM_DISK_GB = "127.0.0.1:5999", 30
    source = make_node("sim:1xRTX3090", disk_gb=1000)
    full = make_node("sim:4xRTX3090", disk_gb=100)  # most free cards, too little disk
    roomy = make_node("sim:2xRTX3090", disk_gb=130)
    w = workload(user, status=S.STOPPED, node=source, disk_gb=100)

    with pytest.raises(Conflict, match=f"{full.name} has 100 GB left for tenants' disks; this instance's need 130 GB"):
        workload_move(w, target=full)
    w.refresh_from_db()
    assert w.status == S.STOPPED and not Move.objects.exists()

    assert workload_move(w).target == roomy
    other = workload(user, status=S.STOPPED, node=source, disk_gb=1)
    with pytest.raises(Conflict, match="has 0 GB left"):
        workload_move(other, target=roomy)  # the first copy holds its room
