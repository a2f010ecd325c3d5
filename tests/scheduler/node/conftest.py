"""Fixtures for the node agent's tests."""

import pytest

from tests.conftest import make_node, remove_node_containers


@pytest.fixture
def sim_node():
    """Makes registered nodes of simulated cards (``sim_node("sim:2xRTX3090")``); their containers go afterwards."""
    made = []

    def make(spec: str = "sim:1xRTX3090"):
        made.append(make_node(spec))
        return made[-1]

    yield make
    for node in made:
        remove_node_containers(node.name)
