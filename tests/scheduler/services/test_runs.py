"""Run numbers: taken without the workload's row lock, so two hosts numbering at once each get their own."""

import pytest

from scheduler.models import WorkloadRun
from scheduler.services import runs
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


def test_a_number_another_host_took_meanwhile_is_not_taken_again(user, monkeypatch):
    job = workload(user, kind="job", gpu_count=2)
    mine, theirs = make_node(), make_node()
    assert runs.run_number_take(job, mine) == 1
    atomic = runs.transaction.atomic
    raced = []

    def racing_atomic():
        if not raced:  # the other host's member inserts the number this host has just read as free
            raced.append(WorkloadRun.objects.create(workload=job, number=2, rank=0, node=theirs, node_name=theirs.name))
        return atomic()

    monkeypatch.setattr(runs.transaction, "atomic", racing_atomic)
    assert runs.run_number_take(job, mine, rank=1) == 3
    taken = WorkloadRun.objects.filter(workload=job).values_list("number", "rank", "node_name")
    assert list(taken) == [(1, 0, mine.name), (2, 0, theirs.name), (3, 1, mine.name)]
