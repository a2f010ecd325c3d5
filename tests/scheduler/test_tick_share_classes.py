"""One share size per card in the live tick: the class read from the allocations, and the simulator agreeing."""

import pytest

from scheduler.holding import CapacityCache
from scheduler.models import WorkloadStatus
from scheduler.services.allocation import Share, allocation_create
from scheduler.sim.simulator import simulate, uniform_nodes
from scheduler.sim.traces import TraceJob
from scheduler.tick import schedule_tick
from tests.conftest import make_node, remove_node_containers
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


@pytest.fixture
def node():
    node = make_node("sim:2xRTX3090", cpu_cores=16, memory_mb=32768)
    yield node
    remove_node_containers(node.name)


def holding_a_quarter(user, card):
    w = workload(user, gpu_milli=250)
    assert allocation_create(workload=w, node_id=card.node_id, shares=[Share(card.pk, 250, card.memory_mb // 4)])
    return w


def test_the_tick_reads_each_cards_class_from_its_allocations(user, node):
    first, second = node.gpus.order_by("index")
    holding_a_quarter(user, first)
    [spec] = [n for n in CapacityCache().read() if n.id == node.pk]
    assert [(c.free_milli, c.share_class) for c in spec.cards] == [(750, 250), (1000, 0)]


def test_the_tick_puts_a_half_beside_a_quarter_never_on_its_card(user, node):
    first, second = node.gpus.order_by("index")
    holding_a_quarter(user, first)
    half = workload(user, gpu_milli=500)
    assert schedule_tick().placed == [half.pk]
    assert [a.gpu_id for a in half.allocations.all()] == [second.pk]


def test_the_tick_and_the_simulator_place_the_same_work(user, node):
    # One card serves quarters; a half, a quarter, a half and a tenth arrive. Both cards fill by size:
    # halves on the empty card, the quarter beside the quarter; the tenth has no card of its size left.
    first, _ = node.gpus.order_by("index")
    holding_a_quarter(user, first)
    sizes = [500, 250, 500, 100]
    queued = [workload(user, gpu_milli=milli) for milli in sizes]

    placed = set(schedule_tick().placed)

    jobs = [TraceJob(0, 0, 10_000, 1, 250), *[TraceJob(i, 1, 10_000, 1, m) for i, m in enumerate(sizes, start=1)]]
    result = simulate(jobs, uniform_nodes(2), strategy="fgd", share_sizes=None)
    simulated = {i for i, start in result.first_start.items() if start <= 1} - {0}
    assert placed == {queued[i - 1].pk for i in simulated} == {w.pk for w in queued[:3]}
    tenth = queued[3]
    tenth.refresh_from_db()
    assert tenth.status == WorkloadStatus.QUEUED and "one share size per card" in tenth.status_reason
