"""The SDK's request and response shapes against the server's OpenAPI schema (/api/schema/): a field the SDK
reads or sends that the server does not have fails here, not in a user's script."""

import pytest
from gpucloud import models
from rest_framework.test import APIClient


@pytest.fixture
def schema(user):
    client = APIClient()
    client.force_authenticate(user)
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return response.json()


def properties(schema: dict, component: str) -> set[str]:
    assert component in schema["components"]["schemas"], f"the server's schema has no {component}"
    return set(schema["components"]["schemas"][component]["properties"])


@pytest.mark.parametrize("model", models.RESPONSES, ids=lambda m: m.__name__)
def test_every_field_the_sdk_reads_is_in_the_servers_answer(schema, model):
    missing = set(model.api_fields()) - properties(schema, model.SCHEMA)
    assert not missing, f"{model.__name__} reads {sorted(missing)}, which {model.SCHEMA} does not have"


@pytest.mark.parametrize("component", sorted(models.REQUESTS))
def test_every_field_the_sdk_sends_is_in_the_servers_input(schema, component):
    sent = set(models.REQUESTS[component])
    accepted = properties(schema, component)
    assert not (sent - accepted), f"the SDK sends {sorted(sent - accepted)}, which {component} lacks"


def test_the_routes_the_sdk_calls_are_in_the_schema(schema):
    paths = set(schema["paths"])
    for route in (
        "/api/v1/auth/token/", "/api/v1/me/", "/api/v1/gpu-types/", "/api/v1/images/", "/api/v1/jobs/",
        "/api/v1/jobs/{job_id}/", "/api/v1/jobs/{job_id}/cancel/", "/api/v1/jobs/{job_id}/files/",
        "/api/v1/jobs/{job_id}/files/download/", "/api/v1/jobs/{job_id}/files/upload/", "/api/v1/instances/",
        "/api/v1/instances/{instance_id}/stop/", "/api/v1/instances/{instance_id}/save-image/",
        "/api/v1/billing/", "/api/v1/billing/statement/",
    ):  # fmt: skip
        assert route in paths, route


def test_the_array_shape_the_sdk_reads_is_the_servers(schema):
    route = schema["paths"]["/api/v1/arrays/{array_id}/"]
    reference = route["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    component = reference.rsplit("/", 1)[-1]
    missing = set(models.ArrayJob.api_fields()) - properties(schema, component)
    assert not missing, f"ArrayJob reads {sorted(missing)}, which {component} does not have"
