"""Workload services: every request is a compare-and-swap on the row as it is now."""

import pytest

from core.errors import Conflict
from scheduler.models import Workload, WorkloadStatus
from scheduler.services.workloads import workload_restart
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


def test_restart_is_refused_when_the_work_stopped_after_it_was_read(user):
    w = workload(user, status=WorkloadStatus.RUNNING)
    Workload.objects.filter(pk=w.pk).update(status=WorkloadStatus.STOPPED)  # a concurrent stop won

    with pytest.raises(Conflict):
        workload_restart(w)

    assert not w.events.filter(reason="restart requested").exists()


def test_restart_of_running_work_is_recorded_once(user):
    w = workload(user, status=WorkloadStatus.RUNNING, node=make_node())
    workload_restart(w)
    assert list(w.events.values_list("from_status", "to_status", "reason")) == [
        ("running", "running", "restart requested")
    ]
