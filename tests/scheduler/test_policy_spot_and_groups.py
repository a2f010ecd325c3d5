"""The policy's spot rules for jobs and its per-group running cap (job arrays), on plain objects."""

from scheduler.policy import CardSpec, ClusterState, MlfqConfig, NodeSpec, Request, Work, decide
from scheduler.policy.decide import DISCIPLINES

MLFQ = DISCIPLINES["mlfq"](MlfqConfig(thresholds=(3600.0, 8 * 3600.0)))


def cluster(cards=2):
    return ClusterState([NodeSpec("n1", 64, 262144, [CardSpec(f"c{i}", "A100", 81920) for i in range(cards)])])


def work(work_id, *, user="u", submitted=0.0, **fields):
    request = Request(work_id, "A100", 1, 1000)
    return Work(work_id, user, request, submitted=submitted, waiting_since=submitted, **fields)


def running(work_id, card, **fields):
    w = work(work_id, preemptible=True, **fields)
    w.node, w.cards = 0, [card]
    return w


def test_an_on_demand_job_evicts_a_spot_job_even_from_a_lower_queue():
    c = cluster(1)
    c.take(0, [0], 1000, 1, 1)
    spot = running("spot", 0, spot=True)
    waiter = work("od", preemptible=True, attained=1e9, submitted=1)  # a batch job deep in the queues
    d = decide([waiter], [spot], c, now=2, discipline=MLFQ)
    assert [p.work_id for p in d.preempt] == ["spot"]


def test_a_spot_job_never_evicts_on_demand_work_even_from_a_higher_queue():
    c = cluster(1)
    c.take(0, [0], 1000, 1, 1)
    batch = running("batch", 0, attained=1e9)  # on-demand, preemptible, sunk to the last queue
    d = decide([work("spot", preemptible=True, spot=True, submitted=1)], [batch], c, now=2, discipline=MLFQ)
    assert d.preempt == [] and "spot" in d.waiting


def test_a_group_never_runs_more_than_its_cap_and_the_rest_waits_saying_why():
    c = cluster(4)
    tasks = [work(f"t{i}", group="a1", group_cap=2, submitted=i) for i in range(4)]
    d = decide(tasks, [], c, now=10, discipline=MLFQ)
    assert sorted(p.work_id for p in d.place) == ["t0", "t1"]
    assert "at most 2" in d.waiting["t2"].reason and "t3" in d.waiting


def test_running_members_count_against_the_cap_and_others_use_the_free_cards():
    c = cluster(4)
    c.take(0, [0], 1000, 1, 1)
    member = running("t0", 0, group="a1", group_cap=2)
    tasks = [work(f"t{i}", group="a1", group_cap=2, submitted=i) for i in (1, 2)]
    other = work("other", user="v", submitted=5)
    d = decide([*tasks, other], [member], c, now=10, discipline=MLFQ)
    assert sorted(p.work_id for p in d.place) == ["other", "t1"]


def test_work_held_back_by_its_cap_never_preempts():
    c = cluster(1)
    c.take(0, [0], 1000, 1, 1)
    victim = running("low", 0, attained=1e9)
    member = running("t0", 0, group="a1", group_cap=1)
    member.cards = []  # holds no card here: only its count matters
    d = decide([work("t1", group="a1", group_cap=1, submitted=1)], [victim, member], c, now=2, discipline=MLFQ)
    assert d.preempt == [] and "at most 1" in d.waiting["t1"].reason


def test_spot_work_preempted_more_than_allowed_falls_back_to_on_demand_and_may_then_evict_spot():
    c = cluster(1)
    c.take(0, [0], 1000, 1, 1)
    other_spot = running("other", 0, spot=True)
    tired = work("tired", preemptible=True, spot=True, preemptions=4, fallback_after=3, submitted=1)
    d = decide([tired], [other_spot], c, now=2, discipline=MLFQ)
    assert d.on_demand == ["tired"] and not tired.spot
    assert [p.work_id for p in d.preempt] == ["other"]


def test_spot_work_stays_spot_at_its_limit_without_a_fallback_or_before_its_deadline():
    at_limit = work("a", preemptible=True, spot=True, preemptions=3, fallback_after=3)
    no_fallback = work("b", preemptible=True, spot=True, preemptions=50)
    early = work("c", preemptible=True, spot=True, fallback_at=100.0)
    late = work("d", preemptible=True, spot=True, fallback_at=100.0, submitted=1)
    d = decide([at_limit, no_fallback, early], [], cluster(0), now=99, discipline=MLFQ)
    assert d.on_demand == []
    assert decide([late], [], cluster(0), now=100, discipline=MLFQ).on_demand == ["d"]


def test_waiting_on_demand_work_takes_free_cards_before_earlier_spot_work():
    evicted_spot = work("spot", preemptible=True, spot=True, submitted=0)
    on_demand = work("od", preemptible=True, submitted=5)
    d = decide([evicted_spot, on_demand], [], cluster(1), now=10, discipline=MLFQ)
    assert [p.work_id for p in d.place] == ["od"] and "spot" in d.waiting
