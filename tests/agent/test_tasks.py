"""The node queue's tasks: what a node does with a message addressed to several nodes."""

from agent import actions, tasks


def test_a_node_launches_its_own_part_of_a_shared_launch_message(monkeypatch):
    launched, sent = [], []
    monkeypatch.setattr(
        actions, "agent_launch", lambda workload_id, node_name: launched.append((workload_id, node_name))
    )
    monkeypatch.setattr(tasks, "send", lambda task, *args, node: sent.append((task, args, node)))

    tasks.agent_launch_many.apply(args=[{"gpu-a": [1], "gpu-b": [2, 3]}], routing_key="node.gpu-b").get()

    assert launched == [(2, "gpu-b")]
    assert sent == [(tasks.ToNode.LAUNCH, (3, "gpu-b"), "gpu-b")]
