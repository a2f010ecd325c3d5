"""Fractions enforced by the card's classic MPS daemon: what the agent runs, the limits it sets, what a container
sees, what a tenant can and cannot do, and the watch that keeps one CUDA process per fractional container.

No GPU here: ``nvidia-smi``, ``nvidia-cuda-mps-control`` and a tenant's CUDA process are the fakes of
``tests/fakes/nvidia``, which behave as driver r580 did on an H200 (``docs/gpu-check``); the containers are
real. ``bench/gpu_check.sh`` checks the same on a card (README, "Fractions on a real GPU host").
"""

import os
import signal
import time
from types import SimpleNamespace

import pytest
from django.db import transaction

from agent import hostservices, launcher, mps
from agent.actions import agent_launch
from agent.mps_watch import MpsWatch
from scheduler.models import WorkloadStatus
from scheduler.services.allocation import Share, allocation_create
from scheduler.services.lifecycle import allocations_free
from tests.fakes.nvidia import first_line, installed
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db

PS = (
    "PID       ID        SERVER         DEVICE                    NAMESPACE      COMMAND        \n"
    "948       5         861            GPU-c403ac2a-214d-c866    4026532259     /opt/torch/.venv/bin/python3\n"
    "935       6         861            GPU-c403ac2a-214d-c866    4026532267     /opt/torch/.venv/bin/python3"
)


@pytest.fixture
def node(sim_node):
    """Two RTX 3090s (indexes 0, 1) and an A100 of simulated cards; its containers go afterwards."""
    return sim_node


@pytest.fixture
def nvidia(node, monkeypatch, settings, tmp_path):
    """The node's cards declared to the fake NVIDIA tools, MPS enforced, daemons under a folder of the test's."""
    cards = [f"{g.uuid}:{g.memory_mb}:NVIDIA GeForce RTX 3090:82" for g in node.gpus.order_by("index")]
    settings.GPU_SHARE_ENFORCE, settings.MPS_DIR = "mps", str(tmp_path / "mps")
    with installed(monkeypatch, cards) as fake:
        yield fake


def launch(user, node, milli, image):
    card = node.gpus.get(index=0)
    w = workload(user, gpu_milli=milli, image_ref=image, memory_mb=256)
    assert allocation_create(
        workload=w, node_id=node.pk, shares=[Share(card.pk, milli, card.memory_mb * milli // 1000)]
    )
    agent_launch(w.pk)
    w.refresh_from_db()
    return w


def run_in(w, command: str) -> str:
    container = launcher.docker_client().containers.get(w.container_name)
    return container.exec_run(["sh", "-c", command]).output.decode().strip()


def compute_mode(nvidia, uuid: str) -> str:
    """As an operator reads it: ``nvidia-smi --query-gpu=compute_mode``."""
    query = ["nvidia-smi", "-i", uuid, "--query-gpu=compute_mode", "--format=csv,noheader"]
    return nvidia.run(query).stdout.strip()


def card_of(node, index=0) -> mps.Card:
    return mps.host_from_settings().card(node.gpus.get(index=index).uuid)


def test_a_fraction_makes_its_card_exclusive_with_a_daemon_that_holds_it_at_the_shares_limits(
    nvidia, node, user, base_image
):
    w = launch(user, node, 500, base_image)
    assert w.status == WorkloadStatus.RUNNING, w.status_reason

    card = card_of(node)
    assert compute_mode(nvidia, card.uuid) == "Exclusive_Process"
    assert card.answers() and card.configured_class() == 500
    assert card.ask("get_default_active_thread_percentage") == "50.0"
    assert card.ask("get_default_device_pinned_mem_limit 0") == "12G"  # half of 24,576 MiB
    assert card.servers(), "the agent starts the card's server before any tenant"
    got = first_line(nvidia.client(card.pipe, hold=1))
    assert (got["mps"], got["thread_percentage"], got["memory_limit_mb"]) == (True, 50, 12288)


def test_a_container_sees_the_daemons_control_socket_alone_read_only_at_the_default_path(
    nvidia, node, user, base_image
):
    w = launch(user, node, 500, base_image)
    assert w.status == WorkloadStatus.RUNNING, w.status_reason

    assert run_in(w, "echo $CUDA_MPS_PIPE_DIRECTORY") == "/tmp/nvidia-mps"
    # Not control_privileged (a root tenant quit the daemon through it on the H200), not the pid file.
    assert run_in(w, "ls -A /tmp/nvidia-mps") == "control"
    assert "Read-only file system" in run_in(w, "touch /tmp/nvidia-mps/control 2>&1")
    mount = next(
        m
        for m in launcher.docker_client().containers.get(w.container_name).attrs["Mounts"]
        if m["Destination"] == "/tmp/nvidia-mps/control"
    )
    assert mount["Source"] == str(card_of(node).pipe / "control") and mount["RW"] is False


def test_a_tenants_own_variables_lower_its_limits_but_cannot_raise_them(nvidia, node, user, base_image):
    assert launch(user, node, 500, base_image).status == WorkloadStatus.RUNNING
    pipe = card_of(node).pipe

    raised = first_line(
        nvidia.client(
            pipe, env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=24G"}
        )
    )
    lowered = first_line(nvidia.client(pipe, env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20"}))

    assert (raised["thread_percentage"], raised["memory_limit_mb"]) == (50, 12288)
    assert lowered["thread_percentage"] == 20


def test_a_process_that_skips_the_pipe_gets_no_context_on_the_held_card(nvidia, node, user, base_image):
    assert launch(user, node, 500, base_image).status == WorkloadStatus.RUNNING

    got = first_line(nvidia.client(card_of(node).pipe, env={"CUDA_MPS_PIPE_DIRECTORY": "/nowhere"}))

    assert got["context"] is False and "busy or unavailable" in got["error"]


def test_a_second_share_of_the_same_size_joins_the_running_daemon(nvidia, node, user, base_image):
    first, second = launch(user, node, 500, base_image), launch(user, node, 500, base_image)
    assert first.status == second.status == WorkloadStatus.RUNNING
    assert len(nvidia.daemons()) == 1


def test_a_card_changes_its_share_size_only_once_its_clients_are_gone(nvidia, node):
    card, memory = card_of(node), node.gpus.get(index=0).memory_mb
    card.ensure(500, memory)
    tenant = nvidia.client(card.pipe, hold=30)
    first_line(tenant)

    with pytest.raises(mps.MpsError, match="still has clients"):
        card.ensure(200, memory)
    assert card.configured_class() == 500

    tenant.kill()
    tenant.wait()
    card.ensure(200, memory)
    assert card.configured_class() == 200
    assert card.ask("get_default_active_thread_percentage") == "20.0"
    assert first_line(nvidia.client(card.pipe, hold=1))["thread_percentage"] == 20  # the server started anew


def test_a_whole_card_quits_the_daemon_and_only_then_gives_the_card_back_its_default_mode(
    nvidia, node, user, base_image
):
    fraction = launch(user, node, 500, base_image)
    launcher.container_remove(fraction)
    with transaction.atomic():
        allocations_free(fraction.pk)

    whole = launch(user, node, 1000, base_image)

    assert whole.status == WorkloadStatus.RUNNING, whole.status_reason
    card = card_of(node)
    assert not card.answers() and nvidia.daemons() == []
    assert compute_mode(nvidia, card.uuid) == "Default"
    assert run_in(whole, "ls -A /tmp/nvidia-mps 2>&1; echo ${CUDA_MPS_PIPE_DIRECTORY:-none}").endswith("none")


def test_a_daemon_that_does_not_answer_fails_the_launch_naming_the_card_and_leaves_it_not_exclusive(
    nvidia, node, user, base_image, settings
):
    # As the r580 tool did for the options of another driver: status 0, and nothing started.
    settings.MPS_CONTROL = "true"
    w = launch(user, node, 500, base_image)

    assert w.status == WorkloadStatus.FAILED
    card = node.gpus.get(index=0)
    assert card.uuid in w.status_reason and "did not start" in w.status_reason
    assert compute_mode(nvidia, card.uuid) == "Default"
    assert launcher.containers_on_node(node.name) == {}


def test_simulated_cards_under_auto_run_no_daemon_and_get_no_mount(nvidia, settings, node, user, base_image):
    settings.GPU_SHARE_ENFORCE = "auto"
    w = launch(user, node, 500, base_image)
    assert w.status == WorkloadStatus.RUNNING, w.status_reason
    assert nvidia.daemons() == []
    assert run_in(w, "echo ${CUDA_MPS_PIPE_DIRECTORY:-none} $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "none 50"


def test_fractions_on_real_cards_need_a_user_namespaced_engine(nvidia, settings):
    real = SimpleNamespace(simulated=False)
    share = SimpleNamespace(uuid=nvidia.uuids[0], milli=500, card_memory_mb=24576)
    plain = {"SecurityOptions": ["name=seccomp,profile=builtin"]}
    userns = {"SecurityOptions": ["name=seccomp,profile=builtin", "name=userns"]}

    with pytest.raises(mps.MpsError, match="userns-remap"):
        mps.cards_prepare(real, [share], engine=lambda: plain)
    assert nvidia.daemons() == []

    mps.cards_prepare(real, [share], engine=lambda: userns)
    assert len(nvidia.daemons()) == 1


def test_the_watch_kills_a_containers_second_cuda_process_and_lets_the_others_run(nvidia, node):
    card = card_of(node)
    card.ensure(500, node.gpus.get(index=0).memory_mb)
    first, other, second = (nvidia.client(card.pipe, hold=30) for _ in range(3))
    for process in (first, other, second):
        first_line(process)
    containers = {first.pid: "tenant-a", second.pid: "tenant-a", other.pid: "tenant-b"}
    watch = MpsWatch(card.host, container_of=containers.get)

    stopped = watch.step()

    assert [c.pid for c in stopped] == [second.pid]
    assert second.wait(5) == -signal.SIGKILL
    assert "runs one CUDA process at a time" in second.stderr.read()
    assert first.poll() is None and other.poll() is None
    assert watch.step() == []


def test_the_watch_starts_a_cards_server_again_when_it_is_gone(nvidia, node):
    card = card_of(node)
    card.ensure(500, node.gpus.get(index=0).memory_mb)
    server = card.servers()[0]

    os.kill(server, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while card.servers() and time.monotonic() < deadline:
        time.sleep(0.05)
    MpsWatch(card.host).step()

    assert card.servers() and card.servers()[0] != server


def test_ps_as_r580_prints_it_gives_each_client_its_server_and_pid_namespace():
    assert mps.parse_ps(PS) == [mps.Client(948, 861, "4026532259"), mps.Client(935, 861, "4026532267")]
    assert mps.parse_ps("PID       ID        SERVER         DEVICE                    NAMESPACE      COMMAND") == []


def test_a_share_gets_its_part_of_the_sms_and_of_the_cards_memory():
    assert mps.Limits.of(500, 143771) == mps.Limits(50, 71885)
    assert mps.Limits.of(100, 24576) == mps.Limits(10, 2457)


def test_where_the_agent_runs_in_a_container_each_daemon_runs_in_one_of_its_own(settings, tmp_path):
    settings.HOST_SERVICES, settings.MPS_DIR = "containers", str(tmp_path / "mps")
    host = hostservices.mps_host()
    card = host.card("GPU-5deb25d2-a49b-8878-e1c3-e8b31d9fa6a6")

    spec = hostservices.mps_container_spec(card)

    assert host.start is hostservices.mps_container_start and host.stopped is hostservices.mps_container_stop
    assert spec["command"] == ["nvidia-cuda-mps-control", "-f", "-M"]  # in the foreground: Docker watches it
    assert spec["pid_mode"] == "host" and spec["restart_policy"] == {"Name": "unless-stopped"}
    assert [r.device_ids for r in spec["device_requests"]] == [[card.uuid]]
    assert spec["environment"]["CUDA_MPS_PIPE_DIRECTORY"] == str(card.pipe)
    assert spec["volumes"] == {str(card.base): {"bind": str(card.base), "mode": "rw"}}
