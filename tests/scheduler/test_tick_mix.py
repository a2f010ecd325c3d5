"""The task mix FGD scores against in the live tick: read once a minute, the same object while it is the same (the
scores the tick keeps across ticks are of one mix object)."""

import pytest

from scheduler import tick
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


def test_the_mix_is_read_again_once_a_minute_and_kept_while_it_is_the_same(user, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(tick.time, "monotonic", lambda: clock[0])
    workload(user, gpu_count=1)
    first = tick._mix()
    workload(user, gpu_count=2)
    clock[0] += tick.MIX_REFRESH_S - 1
    assert tick._mix() is first  # within the minute: as read
    clock[0] += 1
    second = tick._mix()
    assert second != first and {t.gpu_count for t in second} == {1, 2}
    clock[0] += tick.MIX_REFRESH_S
    assert tick._mix() is second  # read again, the same: the same object
