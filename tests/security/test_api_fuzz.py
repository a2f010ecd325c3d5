"""The API under schemathesis, against the running ASGI server, from its own OpenAPI schema.

Every operation gets generated requests, valid and invalid: no answer may be a
5xx, and a 400 must name the field it refuses. Half the creations point at a
real image and GPU type (else almost all would stop at "unknown image"), and
path ids are drawn from real objects as well as random ones. ``FUZZ_EXAMPLES``
sets the examples per operation and mode (bounded in CI; more locally, e.g.
FUZZ_EXAMPLES=500).
"""

import collections
import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from billing.models import Account
from portal.services.tokens import token_create
from tests.portal.test_instance_api import create
from tests.portal.test_jobs_and_preemption import submit_job

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))
FITS = {"gpus": "0.5", "cpu_cores": 1, "memory_gb": 1}  # what the test node can give
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def creations_not_throttled(monkeypatch):
    """The server this test starts counts creations at a rate no fuzzing run reaches.

    At the default 60 a minute per user, the creations of the operations fuzzed first (clones, saved
    images, jobs) used the budget up, and whether any instance or job create got through depended on the
    order and the draw (twice in 2,050 requests; none in one CI run). Throttling has tests of its own."""
    monkeypatch.setenv("THROTTLE_CREATE", "100000/min")


@pytest.fixture
def token(user):
    return token_create(user=user, name="fuzz")[1]


def test_no_request_gets_a_server_error_and_every_400_names_a_field(web_server, token, api, user, catalog, sim_node):
    real = {
        "instance_id": [create(api, catalog).data["id"] for _ in range(2)],
        "job_id": [submit_job(api, catalog).pk],
        "image": catalog["image"].pk,
        "gpu_type": str(catalog["rtx3090"].pk),
    }
    auth = {"Authorization": f"Token {token}"}
    schema = schemathesis.openapi.from_url(f"http://{web_server}/api/schema/", headers=auth)
    failures, statuses, server_refusals = [], collections.Counter(), []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in schemathesis.GenerationMode:

            @given(case=operation.as_strategy(generation_mode=mode), realistic=st.booleans(), pick=st.integers(0, 9))
            @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            def fuzz(case, realistic, pick):
                if realistic:
                    for name in {"instance_id", "job_id"} & set(case.path_parameters or {}):
                        case.path_parameters[name] = real[name][pick % len(real[name])]
                    if isinstance(case.body, dict) and "image" in case.body:
                        case.body |= {"image": real["image"], "gpu_type": real["gpu_type"], **FITS}
                response = case.call(headers=auth)
                statuses[response.status_code] += 1
                # A fuzzed monthly budget (PATCH /billing/, often 0) would refuse every later create with 402.
                Account.objects.filter(user=user).update(monthly_budget=None)
                where = f"{case.method} {case.formatted_path} {case.query or ''} {str(case.body)[:300]}"
                assert response.status_code < 500, f"{where}: {response.status_code} {response.text[:300]}"
                if response.status_code == 400 and not response.content and "content-type" not in response.headers:
                    server_refusals.append(where)  # the HTTP server refused it as malformed: no app 400
                elif response.status_code == 400:
                    assert "application/json" in str(response.headers.get("content-type")), (
                        f"{where}: a 400 that is not JSON: {response.text[:200]!r} headers={case.headers}"
                    )
                    body = response.json()
                    assert isinstance(body, dict) and set(body) - {"detail"}, f"{where}: a 400 naming no field: {body}"

            try:
                fuzz()
            except AssertionError as exc:
                failures.append(str(exc).splitlines()[0])
            except Unsatisfiable:
                assert mode is schemathesis.GenerationMode.NEGATIVE  # nothing in it can be made invalid
    print(f"fuzzed {sum(statuses.values())} requests; answers by status: {dict(sorted(statuses.items()))}")
    print(f"of the 400s, {len(server_refusals)} came from the HTTP server itself (malformed requests)")
    assert not failures, "\n".join(failures)
    assert statuses[201] and statuses[202], "the fuzzing never reached a successful create and action"
