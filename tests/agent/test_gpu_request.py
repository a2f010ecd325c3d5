"""What a container asks of the NVIDIA Container Toolkit: its cards by UUID through Docker's "nvidia" device
driver, compute and utility of the driver, the same in its environment, nothing without cards; and a stored
environment that carries names reserved to the platform or the toolkit loses them at launch."""

import uuid

import pytest

from agent import launcher
from scheduler import envnames
from scheduler.models import Node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db
CARDS = ["GPU-3f5c2b1e-7a0d-4e6b-9c1a-0b2d4f6e8a01", "GPU-8e1d0c2b-5a4f-4b3e-8d7c-6f5e4d3c2b10"]


def node(*, nvidia_runtime=True, simulated=False) -> Node:
    return Node.objects.create(
        name=f"gpu-{uuid.uuid4().hex[:6]}",
        hostname="h",
        cpu_cores=8,
        memory_mb=8192,
        nvidia_runtime=nvidia_runtime,
        simulated=simulated,
    )


def spec(work, where, cards=CARDS, **options) -> dict:
    shares = [launcher.CardShare(card, 1000, 80000, 80000) for card in cards]
    return launcher.container_spec(work, node=where, shares=shares, **options)


def test_a_real_card_is_requested_by_uuid_from_the_nvidia_driver_with_compute_and_utility(user):
    made = spec(workload(user, gpu_count=2), node())
    (request,) = made["device_requests"]
    assert (request["Driver"], request["DeviceIDs"], request["Count"]) == ("nvidia", CARDS, 0)
    assert request["Capabilities"] == [["gpu", "compute", "utility"]]
    # The environment says what Docker appends for the request, so every copy names the same cards.
    assert made["environment"]["NVIDIA_VISIBLE_DEVICES"] == ",".join(CARDS)
    assert made["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"


@pytest.mark.parametrize(
    "where", [{"nvidia_runtime": False}, {"simulated": True}], ids=["engine-without-the-toolkit", "simulated-cards"]
)
def test_no_device_is_requested_where_the_engine_has_no_toolkit_or_the_cards_are_simulated(user, where):
    made = spec(workload(user, gpu_count=2), node(**where))
    assert "device_requests" not in made
    assert made["environment"]["NVIDIA_VISIBLE_DEVICES"] == ",".join(CARDS)


def test_work_without_cards_asks_the_toolkit_for_nothing_at_all(user):
    made = spec(workload(user, no_gpu=True), node(), cards=[])  # started without a GPU
    assert "device_requests" not in made
    assert made["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"  # the toolkit's "same as runc"


def test_a_stored_environment_loses_the_names_reserved_to_the_platform_and_the_toolkit(user):
    stored = {
        "LD_PRELOAD": "/proc/self/cwd/evil.so",
        "LD_AUDIT": "/evil.so",
        "NVIDIA_DRIVER_CAPABILITIES": "all",
        "NVIDIA_VISIBLE_DEVICES": "all",
        "CUDA_MPS_PIPE_DIRECTORY": "/elsewhere",
        "GPUCLOUD_CHECKPOINT_DIR": "/etc",
        "RANK": "7",
        "LD_LIBRARY_PATH": "/opt/conda/lib",
        "LR": "3e-4",
    }
    env = spec(workload(user, kind="job", gpu_count=2, env=stored), node())["environment"]
    assert "LD_PRELOAD" not in env and "LD_AUDIT" not in env and "CUDA_MPS_PIPE_DIRECTORY" not in env
    assert (env["NVIDIA_DRIVER_CAPABILITIES"], env["NVIDIA_VISIBLE_DEVICES"]) == ("compute,utility", ",".join(CARDS))
    assert env["GPUCLOUD_CHECKPOINT_DIR"] != "/etc" and "RANK" not in env  # torchrun's own, never the job's
    assert (env["LD_LIBRARY_PATH"], env["LR"]) == ("/opt/conda/lib", "3e-4")


def test_every_name_the_launcher_sets_is_one_a_tenant_may_not(user, settings):
    settings.GPU_SHARE_ENFORCE = "mps"  # a fraction's MPS variables too
    job = workload(user, kind="job", gpu_count=2)
    gang = launcher.Rendezvous(rank=1, hosts=(("10.0.0.1", 2), ("10.0.0.2", 2)), master_addr="10.0.0.1")
    made = [
        spec(job, node(), with_code=True),
        spec(job, node(), rendezvous=gang, name="member-1"),
        spec(workload(user, gpu_milli=500), node(simulated=True), cards=CARDS[:1]),
    ]
    fraction = launcher.container_spec(
        workload(user, gpu_milli=500), node=node(simulated=True), shares=[launcher.CardShare(CARDS[0], 500, 40000)]
    )
    names = {name for each in [*made, fraction] for name in each["environment"]}
    assert {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "MASTER_ADDR", "GPUCLOUD_CODE_DIR"} <= names
    assert [name for name in sorted(names) if envnames.why_reserved(name) is None] == []
