"""One request type per kind of work (portal/services/requests.py): the API's inputs and the console's forms build it,
the services take it. A field added to an interface and not to the request fails here, not as a keyword dropped."""

from decimal import Decimal

import pytest

from core.errors import InvalidInput
from portal.api.arrays import ArrayListApi
from portal.api.views import InstanceListApi, JobListApi
from portal.console.forms import InstanceCreateForm, JobCreateForm
from portal.models import Job, JobArray
from portal.services import arrays, work
from portal.services.requests import ArrayRequest, InstanceRequest, JobRequest

# What an interface asks that is not the request's: a model size to pick the GPU from (the API), names of ids.
ASKED_ELSEWHERE = {"model_params_b", "precision", "task", "image", "gpu_type"}


@pytest.mark.parametrize(
    "interface, request_class",
    [
        (InstanceListApi.InstanceCreateInput, InstanceRequest),
        (JobListApi.JobCreateInput, JobRequest),
        (ArrayListApi.ArrayCreateInput, ArrayRequest),
    ],
)
def test_every_api_field_is_a_field_of_the_request(interface, request_class):
    assert interface.request_class is request_class
    assert set(interface().fields) - ASKED_ELSEWHERE <= request_class.field_names()


@pytest.mark.parametrize("form, request_class", [(InstanceCreateForm, InstanceRequest), (JobCreateForm, ArrayRequest)])
def test_every_console_field_is_a_field_of_the_request(form, request_class):
    fields = set(form(gpu_types=[], images=[]).fields)
    assert fields - ASKED_ELSEWHERE <= request_class.field_names()


def test_a_field_the_request_does_not_have_is_refused_where_it_is_built(user):
    with pytest.raises(TypeError, match="gpu_count"):
        JobRequest.of(user, dict(name="x", image=1, gpu_type=1, gpus=Decimal(1), command="true", gpu_count=1))


def test_a_priority_by_name_and_the_ids_by_their_interface_names(user):
    request = JobRequest.of(user, dict(name="x", image=3, gpu_type=4, gpus=Decimal(1), command="t", priority="low"))
    assert (request.image_id, request.gpu_type_id, request.priority) == (3, 4, 2)


def _array(user, catalog, **fields) -> ArrayRequest:
    common = dict(owner=user, name="sweep", image_id=catalog["image"].pk, gpu_type_id=catalog["rtx3090"].pk)
    return ArrayRequest(**common, gpus=Decimal("0.5"), cpu_cores=1, memory_gb=1, command="true", **fields)


@pytest.mark.parametrize(
    "fields, field", [(dict(nodes=2), "nodes"), (dict(elastic_min=1, elastic_max=2), "elastic_min")]
)
def test_an_array_refuses_what_its_tasks_cannot_be_whatever_interface_asks(user, catalog, sim_node, fields, field):
    with pytest.raises(InvalidInput) as refused:
        arrays.array_create(_array(user, catalog, array="0-1", **fields))
    assert refused.value.field == field
    assert not JobArray.objects.exists() and not Job.objects.exists()


def test_an_arrays_tasks_take_its_checkpoint_disk(user, catalog, sim_node):
    created = arrays.array_create(_array(user, catalog, array="0-1", checkpoint_gb=20))
    assert [t.workload.disk_gb for t in created.tasks.all()] == [20, 20]


def test_a_clone_asks_what_the_instance_asked(user, catalog, sim_node):
    asked = InstanceRequest(
        owner=user, name="a", image_id=catalog["image"].pk, gpu_type_id=catalog["rtx3090"].pk, gpus=Decimal("0.5"),
        cpu_cores=2, memory_gb=3, disk_gb=20, billing_mode="spot", idle_util_percent=5, idle_minutes=40,
    )  # fmt: skip
    clone = work.instance_clone(instance=work.instance_create(asked), owner=user)
    shape = ("gpus", "cpu_cores", "memory_gb", "disk_gb", "billing_mode", "idle_util_percent", "idle_minutes")
    assert {f: getattr(clone, f) for f in shape} == {f: getattr(asked, f) for f in shape}
    assert clone.name == "a-copy" and clone.workload.spot
