"""GPU inventory: simulated specs, NVML names, and the fallback when NVML is absent."""

import pytest

from agent.gpus import discover, model_key, simulated_inventory
from core.errors import InvalidInput
from scheduler.gpuspec import parse_sim_spec


def test_it_parses_a_simulated_spec_with_memory_from_name_or_table():
    assert parse_sim_spec("sim:4xRTX3090,2xA100-80GB") == [(4, "RTX3090", 24576), (2, "A100-80GB", 81920)]


@pytest.mark.parametrize("spec", ["sim:", "sim:4RTX3090", "sim:2xNOSUCHCARD", "4xA100-80GB"])
def test_it_refuses_a_bad_spec_naming_it(spec):
    with pytest.raises(InvalidInput) as error:
        parse_sim_spec(spec)
    assert error.value.field == "gpu_backend"


def test_simulated_cards_have_stable_unique_uuids_per_node():
    first = simulated_inventory("sim:2xH100", "node-a")
    assert first == simulated_inventory("sim:2xH100", "node-a")
    assert {g.uuid for g in first}.isdisjoint(g.uuid for g in simulated_inventory("sim:2xH100", "node-b"))
    assert [g.index for g in first] == [0, 1]


def test_nvml_names_become_catalog_keys():
    assert model_key("NVIDIA A100-SXM4-80GB") == "A100-SXM4-80GB"
    assert model_key("NVIDIA GeForce RTX 3090") == "GeForce-RTX-3090"


def test_auto_falls_back_to_the_simulated_default_without_a_driver():
    gpus, simulated = discover("auto", node_name="n", sim_default="sim:1xT4")
    assert simulated and [g.model for g in gpus] == ["T4"]


def test_nvml_backend_never_falls_back_to_simulated_cards():
    import pynvml

    try:
        gpus, simulated = discover("nvml", node_name="n", sim_default="sim:1xT4")
    except pynvml.NVMLError:
        return  # no driver here: it refused, as it must
    assert not simulated and all(not g.uuid.startswith("GPU-sim-") for g in gpus)
