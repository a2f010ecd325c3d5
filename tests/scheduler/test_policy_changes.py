"""What ``decide`` changes of the running work it is given, it says: the live tick hands it the works it keeps
across ticks (``scheduler.tick._Kept``) and builds again only those its decisions name (``tick._changed_by``)."""

import copy
import random

from scheduler.policy import MlfqConfig
from scheduler.sim import simulator
from scheduler.sim.simulator import simulate, uniform_nodes
from scheduler.sim.traces import TraceJob


def test_decide_changes_no_running_work_that_its_decisions_do_not_name(monkeypatch):
    rng = random.Random(5)
    jobs = []
    for i in range(120):
        cards = rng.choice([1, 1, 2, 4, 8, 16])
        elastic = cards >= 4 and rng.random() < 0.4
        milli = rng.choice([250, 500]) if cards == 1 and rng.random() < 0.3 else 1000
        jobs.append(
            TraceJob(
                i,
                rng.uniform(0, 3000),
                rng.uniform(30, 2000),
                cards,
                milli,
                user=f"u{i % 5}",
                spot=rng.random() < 0.2,
                elastic_min=max(1, cards // 4) if elastic else None,
            )
        )
    named = {"preempt": 0, "resize": 0}
    decide = simulator.decide

    def checked(waiting, running, *args, **kwargs):
        before = {id(w): copy.deepcopy(w.__dict__) for w in running}
        decisions = decide(waiting, running, *args, **kwargs)
        said = {p.work_id for p in decisions.preempt} | {r.work_id for r in decisions.resize}
        named["preempt"] += len(decisions.preempt)
        named["resize"] += len(decisions.resize)
        changed = [w.id for w in running if w.__dict__ != before[id(w)]]
        assert set(changed) <= said
        return decisions

    monkeypatch.setattr(simulator, "decide", checked)
    config = MlfqConfig(thresholds=(200.0, 4000.0), resize_interval_s=60.0)
    result = simulate(jobs, uniform_nodes(32), policy="mlfq", config=config, restart_s=10)
    assert result.finished == len(jobs)
    assert named["preempt"] > 0 and named["resize"] > 0  # both kinds of change were made, and checked
