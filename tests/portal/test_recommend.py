"""The "recommend" GPU type: memory from parameters and precision, then the cheapest type and card count."""

import pytest

from core.errors import InvalidInput
from portal.models import Instance
from portal.services.recommend import memory_needed_gb

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("params", "precision", "task", "gb"),
    [
        (7, "bf16", "train", 134.4),
        (7, "fp32", "train", 134.4),
        (7, "bf16", "inference", 16.8),
        (70, "int4", "inference", 42.0),
    ],
)
def test_memory_follows_the_bytes_per_parameter_rule_of_thumb(params, precision, task, gb):
    assert memory_needed_gb(params_billion=params, precision=precision, task=task) == pytest.approx(gb)


def test_training_in_int8_is_refused_naming_the_field():
    with pytest.raises(InvalidInput) as error:
        memory_needed_gb(params_billion=1, precision="int8", task="train")
    assert error.value.field == "precision"


@pytest.mark.parametrize(
    ("params", "task", "expected"),
    [(1, "train", ("RTX3090", 1)), (2, "train", ("RTX3090", 2)), (7, "inference", ("RTX3090", 1))],
)
def test_it_recommends_the_cheapest_type_and_card_count_that_fit(api, catalog, sim_node, params, task, expected):
    response = api.get("/api/v1/gpu-types/recommend/", {"model_params_b": params, "task": task})
    assert response.status_code == 200, response.data
    assert (response.data["gpu_type"]["name"], response.data["cards"]) == expected
    assert "cheapest fit" in response.data["reason"]


def test_a_model_too_big_for_any_node_is_refused(api, catalog, sim_node):
    response = api.get("/api/v1/gpu-types/recommend/", {"model_params_b": 70})
    assert response.status_code == 400 and "gpu_type" in response.data


def test_an_instance_can_ask_for_the_recommended_type(api, catalog, sim_node):
    body = {"image": catalog["image"].pk, "gpu_type": "recommend", "model_params_b": 2, "memory_gb": 1}
    response = api.post("/api/v1/instances/", body, format="json")
    assert response.status_code == 201, response.data
    instance = Instance.objects.get()
    assert (instance.gpu_type.name, instance.gpus) == ("RTX3090", 2)


@pytest.mark.parametrize(
    ("body", "field"),
    [({"gpu_type": "recommend"}, "model_params_b"), ({"gpu_type": "fastest"}, "gpu_type"), ({"gpu_type": "1"}, "gpus")],
)
def test_incomplete_gpu_choices_are_refused_naming_the_field(api, catalog, sim_node, body, field):
    response = api.post("/api/v1/instances/", {"image": catalog["image"].pk, **body}, format="json")
    assert response.status_code == 400 and field in response.data, response.data
    assert not Instance.objects.exists()
