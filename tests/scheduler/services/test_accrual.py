"""Attained service: computed for running work at every tick, written for stale rows and changed levels only."""

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from scheduler.models import Workload, WorkloadStatus
from scheduler.services import accrual
from scheduler.services.accrual import service_accrue, service_record
from scheduler.services.allocation import Share, allocation_create
from scheduler.tick import schedule_tick
from tests.conftest import make_node
from tests.scheduler.factories import workload

NOW = timezone.now()


def row(pk=1, *, status=WorkloadStatus.RUNNING, ago=None, started_ago=100.0, utilization=None, **fields):
    values = dict(
        pk=pk,
        status=status,
        no_gpu=False,
        gpu_count=2,
        gpu_milli=1000,
        gpu_utilization=utilization,
        attained_service=50.0,
        accrued_s=None if ago is None else NOW.timestamp() - ago,
        started_s=None if started_ago is None else NOW.timestamp() - started_ago,
        queue_level=0,
    )
    return SimpleNamespace(**{**values, **fields})


def test_running_work_accrues_its_cards_times_the_seconds_since_its_last_accrual_or_its_start():
    accrued = service_accrue(
        [row(1, ago=10.0), row(2, ago=None, started_ago=30.0)], now=NOW, idle_util=0.3, idle_weight=0.25
    )
    assert accrued[1].attained == pytest.approx(50.0 + 2 * 10.0)
    assert accrued[2].attained == pytest.approx(50.0 + 2 * 30.0)
    assert accrued[1].accrued_at == NOW


def test_idle_work_accrues_at_its_weight_and_work_not_running_or_without_cards_not_at_all():
    accrued = service_accrue(
        [
            row(1, ago=10.0, utilization=0.1),
            row(2, ago=10.0, status=WorkloadStatus.STOPPING),
            row(3, ago=None, started_ago=None, status=WorkloadStatus.STARTING),
            row(4, ago=10.0, no_gpu=True),
        ],
        now=NOW,
        idle_util=0.3,
        idle_weight=0.25,
    )
    assert accrued[1].attained == pytest.approx(50.0 + 2 * 10.0 * 0.25)
    assert [accrued[pk].attained for pk in (2, 3, 4)] == [50.0, 50.0, 50.0]
    assert [accrued[pk].accrued_at for pk in (2, 3, 4)] == [None, None, None]  # its next run counts from its start


def test_a_kept_row_accrues_as_a_fresh_one_a_row_read_again_is_rated_again_and_a_departed_one_is_forgotten():
    kept: dict = {}
    busy, idle, gone = row(1, ago=10.0, utilization=0.9), row(2, ago=10.0, utilization=0.1), row(3, ago=10.0)
    first = service_accrue([busy, idle, gone], now=NOW, idle_util=0.3, idle_weight=0.25, kept=kept)
    first[1].queue_level = 1  # as service_record sets the level it writes (a write the row was too new for)
    later = NOW + timedelta(seconds=5)
    idle_now_busy = row(2, ago=10.0, utilization=0.9)  # the row read again: another object

    second = service_accrue([busy, idle_now_busy], now=later, idle_util=0.3, idle_weight=0.25, kept=kept)

    assert second[1] is first[1]  # brought to the tick's time in place, not built again
    assert (second[1].attained, second[1].attained_service) == (pytest.approx(50.0 + 2 * 15.0), pytest.approx(30.0))
    assert (second[1].accrued_at, second[1].queue_level) == (later, 0)  # the row's own level, not the one set
    assert second[2].attained == pytest.approx(50.0 + 2 * 15.0)  # rated as now read: busy
    assert kept.keys() == {1, 2}
    fresh = service_accrue([busy, idle_now_busy], now=later, idle_util=0.3, idle_weight=0.25)
    assert [(a.attained, a.attained_service, a.since) for a in fresh.values()] == [
        (pytest.approx(a.attained), pytest.approx(a.attained_service), a.since) for a in second.values()
    ]


@pytest.mark.django_db
def test_a_row_last_written_a_minute_ago_is_written_a_fresh_one_only_where_its_level_changed(user):
    stale, fresh, moved = (workload(user, status=WorkloadStatus.RUNNING) for _ in range(3))
    rows = [row(stale.pk, ago=accrual.ACCRUAL_WRITE_S + 1), row(fresh.pk, ago=10.0), row(moved.pk, ago=10.0)]
    accrued = service_accrue(rows, now=NOW, idle_util=0.3, idle_weight=0.25)

    service_record(accrued, {moved.pk: 1}, now=NOW)

    written = {
        pk: (service, at, level)
        for pk, service, at, level in Workload.objects.values_list(
            "pk", "attained_service", "accrued_at", "queue_level"
        )
    }
    assert written[stale.pk] == (pytest.approx(2 * (accrual.ACCRUAL_WRITE_S + 1)), NOW, 0)  # added to the row's 0
    assert written[fresh.pk] == (0.0, None, 0)
    assert written[moved.pk] == (pytest.approx(20.0), NOW, 1)


@pytest.mark.django_db
def test_at_most_so_many_stale_rows_are_written_per_tick_the_oldest_first(user, monkeypatch):
    monkeypatch.setattr(accrual, "ACCRUAL_WRITES_PER_TICK", 1)
    older, old = (workload(user, status=WorkloadStatus.RUNNING) for _ in range(2))
    accrued = service_accrue([row(old.pk, ago=100.0), row(older.pk, ago=200.0)], now=NOW, idle_util=0.3, idle_weight=1)

    service_record(accrued, {}, now=NOW)

    assert dict(Workload.objects.values_list("pk", "accrued_at")) == {older.pk: NOW, old.pk: None}


@pytest.mark.django_db(transaction=True)
def test_work_placed_again_accrues_from_its_new_start_not_from_its_last_accrual_in_an_earlier_run(user):
    node = make_node("sim:1xRTX3090")
    card = node.gpus.get()
    earlier_run = timezone.now() - timedelta(hours=5)
    w = workload(user, accrued_at=earlier_run, attained_service=100.0)  # queued again after an earlier run
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    Workload.objects.filter(pk=w.pk).update(
        status=WorkloadStatus.RUNNING, started_at=timezone.now() - timedelta(seconds=accrual.ACCRUAL_WRITE_S + 30)
    )

    schedule_tick()

    w.refresh_from_db()
    assert w.attained_service == pytest.approx(100.0 + accrual.ACCRUAL_WRITE_S + 30, abs=5)


@pytest.mark.django_db
def test_holding_rows_carry_their_times_as_seconds_since_1970_and_none_where_unset(user):
    from scheduler.selectors import holding_rows

    started = timezone.now() - timedelta(minutes=5)
    w = workload(user, status=WorkloadStatus.RUNNING, started_at=started)
    workload(user, name="queued")  # holds nothing

    [r] = holding_rows()

    w.refresh_from_db()
    assert (r.pk, r.accrued_s) == (w.pk, None)
    assert r.started_s == pytest.approx(started.timestamp(), abs=1e-5)
    assert r.created_s == pytest.approx(w.created_at.timestamp(), abs=1e-5)
