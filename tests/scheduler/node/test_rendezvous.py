"""The environment contract of every job and instance (rank 0 of 1 on one node), of a gang's members, and the
fence's way from a member to rank 0's rendezvous port and nowhere else."""

import uuid

import pytest

from scheduler.models import MemberStatus, Node, WorkloadStatus
from scheduler.node import gangs, launcher, network
from scheduler.services.allocation import Part, Placement, Share, allocations_create
from scheduler.services.gangs import gang_members
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db
CONTRACT = {
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "NODE_RANK",
    "NNODES",
    "LOCAL_WORLD_SIZE",
    "GPUCLOUD_HOSTFILE",
    "AUTO_TMPDIR",
}


@pytest.fixture
def node():
    return Node.objects.create(
        name=f"rdv-{uuid.uuid4().hex[:6]}", hostname="a", address="10.9.0.11", cpu_cores=8, memory_mb=8192
    )


def shares(n: int) -> list[launcher.CardShare]:
    return [launcher.CardShare(f"GPU-{i}", 1000, 1000) for i in range(n)]


def test_a_single_node_job_is_rank_0_of_1_on_loopback_and_keeps_its_checkpoints_in_auto_tmpdir(user, node, settings):
    settings.SHARED_FS_META = ""  # no shared storage: a job keeps its checkpoints on its own volume
    job = workload(user, kind="job", gpu_count=2)
    env = launcher.container_spec(job, node=node, shares=shares(2))["environment"]
    assert CONTRACT <= set(env)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"], env["RANK"], env["NODE_RANK"]) == (
        "127.0.0.1",
        "29500",
        "2",
        "0",
        "0",
    )
    assert (env["NNODES"], env["LOCAL_WORLD_SIZE"], env["NPROC_PER_NODE"]) == ("1", "2", "2")
    assert env["AUTO_TMPDIR"] == env["GPUCLOUD_CHECKPOINT_DIR"] == settings.JOB_CHECKPOINT_PATH
    assert launcher.hostfile(job, launcher.Rendezvous()) == b"127.0.0.1 slots=2\n"


def test_an_instance_gets_the_same_contract_and_its_data_disk_as_auto_tmpdir(user, node, settings):
    instance = workload(user, kind="instance", gpu_count=1, gpu_milli=500)
    env = launcher.container_spec(instance, node=node, shares=[launcher.CardShare("GPU-0", 500, 1000)])["environment"]
    assert CONTRACT <= set(env)
    assert (env["WORLD_SIZE"], env["NNODES"], env["AUTO_TMPDIR"]) == ("1", "1", settings.INSTANCE_DATA_PATH)


def test_the_users_own_variables_never_override_the_contract(user, node):
    job = workload(user, kind="job", env={"MASTER_ADDR": "evil", "AUTO_TMPDIR": "/tmp"})
    env = launcher.container_spec(job, node=node, shares=shares(1))["environment"]
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["AUTO_TMPDIR"] != "/tmp"


def test_a_gang_member_finds_rank_0_on_rank_0s_host_and_rank_0_publishes_the_port(user, node, settings):
    settings.SHARED_FS_META, settings.SHARED_FS_MOUNT = "postgres://meta", "/mnt/fs"  # gangs checkpoint there
    settings.INSTANCE_NETWORK_MODE = "fenced"
    job = workload(user, kind="job", gpu_count=4)
    hosts = (("10.9.0.11", 2), ("10.9.0.12", 2))
    rank1 = launcher.Rendezvous(rank=1, hosts=hosts, master_host="10.9.0.11", master_port=29517)
    spec = launcher.container_spec(job, node=node, shares=shares(2), rendezvous=rank1, name="member-1")
    env = spec["environment"]
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"], env["RANK"]) == ("10.9.0.11", "29517", "4", "2")
    assert (env["NODE_RANK"], env["NNODES"], env["LOCAL_WORLD_SIZE"]) == ("1", "2", "2")
    assert env["GPUCLOUD_MASTER_HOST"] == "10.9.0.11" and "ports" not in spec
    assert spec["name"] == "member-1" and spec["labels"]["gpucloud.rank"] == "1"
    assert env["AUTO_TMPDIR"] == env["GPUCLOUD_CHECKPOINT_DIR"] == f"/root/autodl-fs/checkpoints/{job.uid}"
    assert launcher.hostfile(job, rank1) == b"10.9.0.11 slots=2\n10.9.0.12 slots=2\n"

    rank0 = launcher.Rendezvous(rank=0, hosts=hosts, master_host="10.9.0.11", master_port=29517)
    spec = launcher.container_spec(job, node=node, shares=shares(2), rendezvous=rank0)
    assert (spec["environment"]["MASTER_ADDR"], spec["environment"]["GPUCLOUD_MASTER_HOST"]) == (
        "127.0.0.1",  # rank 0 listens in its own container
        "10.9.0.11",
    )
    assert spec["ports"] == {"29517/tcp": ("10.9.0.11", 29517)}  # on its host's address only


def test_the_fence_lets_a_gangs_member_through_to_rank_0s_port_and_nothing_else(user):
    a, b, c = (make_node("sim:1xRTX3090") for _ in range(3))
    Node.objects.filter(pk=a.pk).update(address="10.9.0.11")
    Node.objects.filter(pk=b.pk).update(address="10.9.0.12")
    job = workload(user, kind="job", gpu_count=2)
    card_a, card_b = a.gpus.get(), b.gpus.get()
    placed = allocations_create(
        [Placement(job, a.pk, [Share(card_a.pk, 1000, 1)], rest=(Part(b.pk, [Share(card_b.pk, 1000, 1)]),))]
    )
    assert placed
    job.refresh_from_db()
    rank0, rank1 = gang_members(job)
    assert gangs.gang_rules(b.name) == []  # no address yet: nothing lets it through
    rank1.address = "10.9.22.5"
    rank1.status = MemberStatus.RUNNING
    rank1.save()
    rank0.address = "10.9.11.5"
    rank0.save()
    rules = gangs.gang_rules(b.name)
    assert rules == [
        ["-s", "10.9.22.5/32", "-d", "10.9.0.11/32", "-p", "tcp", "-m", "tcp", "--dport", str(job.master_port)]
        + ["-m", "comment", "--comment", f"gang-{job.uid}", "-j", "ACCEPT"]
    ]
    assert gangs.gang_rules(a.name) == []  # rank 0 is reached on its host's published port
    assert gangs.gang_rules(c.name) == []
    job.status = WorkloadStatus.QUEUED  # the gang left its cards: its way through closes
    job.save()
    assert gangs.gang_rules(b.name) == []


def test_the_fence_jumps_to_the_gangs_chain_before_its_drops():
    rules = network.fence_rules()
    jump = rules.index(["-j", gangs.CHAIN])
    assert jump == 1 and all(rule[-1] == "DROP" for rule in rules[jump + 1 : -1])
