"""A move's cleanup deletes a copy of an instance's disks only when the database says that copy is not the
instance's any more: a redelivered or forged message (any host holds the signing key) about a move that has
since been undone must not delete the live disk. Against the real Docker engine."""

import pytest

from agent import launcher, moves
from scheduler.models import Move, MoveStatus, WorkloadStatus
from tests.conftest import make_node, remove_node_containers
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db
S = WorkloadStatus


@pytest.fixture
def hosts():
    a, b = make_node("sim:2xRTX3090"), make_node("sim:2xRTX3090")
    yield a, b
    for node in (a, b):
        remove_node_containers(node.name)


def disk_on(node, w) -> bool:
    return w.uid in launcher.volumes_on_node(node.name)


def test_a_redelivered_cleanup_after_the_instance_moved_back_leaves_its_live_disk(user, hosts):
    a, b = hosts
    w = workload(user, status=S.STOPPED, pinned_node=a)
    there = Move.objects.create(workload=w, source=a, target=b, status=MoveStatus.DONE)
    Move.objects.create(workload=w, source=b, target=a, status=MoveStatus.DONE)  # and back again
    launcher.data_volume_ensure(w, node_name=a.name)  # the disk it came back with, on a

    moves.agent_move_cleanup(there.pk, "source")  # the first move's message, again
    assert disk_on(a, w)

    # While it moves back to a, a's copy is the one being filled.
    w.pinned_node = b
    w.status = S.MOVING
    w.save(update_fields=["pinned_node", "status"])
    back = Move.objects.filter(source=b).get()
    Move.objects.filter(pk=back.pk).update(status=MoveStatus.COPYING)
    moves.agent_move_cleanup(there.pk, "source")
    assert disk_on(a, w)

    # Once it settled on b (the move back failed), a's copy goes: the cleanup acts when it is due.
    Move.objects.filter(pk=back.pk).update(status=MoveStatus.FAILED)
    w.status = S.STOPPED
    w.save(update_fields=["status"])
    moves.agent_move_cleanup(there.pk, "source")
    assert not disk_on(a, w)


def test_a_cleanup_the_moves_state_does_not_call_for_deletes_nothing(user, hosts):
    a, b = hosts
    w = workload(user, status=S.MOVING, pinned_node=a)
    move = Move.objects.create(workload=w, source=a, target=b)  # copying
    launcher.data_volume_ensure(w, node_name=a.name)

    moves.agent_move_cleanup(move.pk, "source")  # forged: the move has not finished
    moves.agent_move_cleanup(move.pk, "target")  # nor failed
    moves.agent_move_cleanup(move.pk, "elsewhere")
    assert disk_on(a, w)
    moves.agent_move_cleanup(move.pk + 1000, "source")  # no such move: nothing to do, nothing raised

    Move.objects.filter(pk=move.pk).update(status=MoveStatus.FAILED)
    w.status = S.STOPPED
    w.save(update_fields=["status"])
    moves.agent_move_cleanup(move.pk, "source")  # a failed move's source keeps the instance
    assert disk_on(a, w)
