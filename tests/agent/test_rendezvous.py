"""The environment contract of every job and instance (rank 0 of 1 on one node), of a gang's members, and the
fence's way between a gang's members (each pair, both ways, unmasqueraded) and nowhere else."""

import uuid

import pytest

from agent import actions, collector, gangs, launcher, mps, network
from core.messages import ToNode
from scheduler.models import MemberStatus, Node, WorkloadMember, WorkloadStatus
from scheduler.services import gangs as gang_service
from scheduler.services.allocation import Part, Placement, Share, allocations_create
from scheduler.services.gangs import gang_members
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db
CONTRACT = {
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "NODE_RANK",
    "NNODES",
    "NPROC_PER_NODE",
    "GPUCLOUD_HOSTFILE",
    "AUTO_TMPDIR",
}
# What torchrun sets for each process it starts: Lightning would take the container's one process for them.
LAUNCHED = {"RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"}


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
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"], env["NODE_RANK"]) == (
        "127.0.0.1",
        "29500",
        "2",
        "0",
    )
    assert (env["NNODES"], env["NPROC_PER_NODE"]) == ("1", "2")
    assert LAUNCHED.isdisjoint(env) and "GLOO_SOCKET_IFNAME" not in env  # one container: loopback will do
    assert env["AUTO_TMPDIR"] == env["GPUCLOUD_CHECKPOINT_DIR"] == settings.JOB_CHECKPOINT_PATH
    assert launcher.hostfile(job, launcher.Rendezvous()) == b"127.0.0.1 slots=2\n"


def test_with_the_shared_storage_a_single_node_jobs_auto_tmpdir_is_there_and_outlives_its_host(user, node, settings):
    settings.SHARED_FS_META, settings.SHARED_FS_MOUNT = "postgres://meta", "/mnt/fs"
    job = workload(user, kind="job", gpu_count=1)
    spec = launcher.container_spec(job, node=node, shares=shares(1))
    env = spec["environment"]
    # The owner's folder on the volume every host mounts (bound whole at /root/autodl-fs), not the host's volume.
    assert env["AUTO_TMPDIR"] == env["GPUCLOUD_CHECKPOINT_DIR"] == f"/root/autodl-fs/checkpoints/{job.uid}"
    assert spec["volumes"][f"/mnt/fs/users/{user.pk}"] == {"bind": "/root/autodl-fs", "mode": "rw"}
    assert spec["volumes"][job.volume_name] == {"bind": settings.JOB_CHECKPOINT_PATH, "mode": "rw"}  # its code
    instance = workload(user, kind="instance", gpu_count=1)
    assert launcher.container_spec(instance, node=node, shares=shares(1))["environment"]["AUTO_TMPDIR"] == (
        settings.INSTANCE_DATA_PATH  # an instance's is its data disk, as AutoDL's autodl-tmp
    )


def test_an_instance_gets_the_same_contract_and_its_data_disk_as_auto_tmpdir(user, node, settings):
    instance = workload(user, kind="instance", gpu_count=1, gpu_milli=500)
    env = launcher.container_spec(instance, node=node, shares=[launcher.CardShare("GPU-0", 500, 1000)])["environment"]
    assert CONTRACT <= set(env)
    assert (env["WORLD_SIZE"], env["NNODES"], env["AUTO_TMPDIR"]) == ("1", "1", settings.INSTANCE_DATA_PATH)


def test_the_users_own_variables_never_override_the_contract(user, node):
    job = workload(user, kind="job", env={"MASTER_ADDR": "evil", "AUTO_TMPDIR": "/tmp"})
    env = launcher.container_spec(job, node=node, shares=shares(1))["environment"]
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["AUTO_TMPDIR"] != "/tmp"


def test_every_gang_member_finds_rank_0_at_its_container_address_and_none_is_told_it_was_launched(user, node, settings):
    settings.SHARED_FS_META, settings.SHARED_FS_MOUNT = "postgres://meta", "/mnt/fs"  # gangs checkpoint there
    settings.INSTANCE_NETWORK_MODE = "fenced"
    job = workload(user, kind="job", gpu_count=4, env={"LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "x"})
    hosts = (("10.9.0.11", 2), ("10.9.0.12", 2))
    rank1 = launcher.Rendezvous(
        rank=1, hosts=hosts, master_addr="10.9.11.254", master_port=29517, address="10.9.22.254"
    )
    spec = launcher.container_spec(job, node=node, shares=shares(2), rendezvous=rank1, name="member-1")
    env = spec["environment"]
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"]) == ("10.9.11.254", "29517", "4")
    assert (env["NODE_RANK"], env["NNODES"], env["NPROC_PER_NODE"]) == ("1", "2", "2")
    assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == ("eth0", "eth0")
    assert LAUNCHED.isdisjoint(env)  # not set, and a stored one from before the rule is dropped
    assert "ports" not in spec  # nothing of a gang is published: its fellows reach it at its own address
    endpoint = spec["networking_config"][settings.INSTANCE_NETWORK]
    assert endpoint["IPAMConfig"] == {"IPv4Address": "10.9.22.254"}
    assert spec["name"] == "member-1" and spec["labels"]["gpucloud.rank"] == "1"
    assert env["AUTO_TMPDIR"] == env["GPUCLOUD_CHECKPOINT_DIR"] == f"/root/autodl-fs/checkpoints/{job.uid}"
    assert launcher.hostfile(job, rank1) == b"10.9.0.11 slots=2\n10.9.0.12 slots=2\n"

    rank0 = launcher.Rendezvous(
        rank=0, hosts=hosts, master_addr="10.9.11.254", master_port=29517, address="10.9.11.254"
    )
    spec = launcher.container_spec(job, node=node, shares=shares(2), rendezvous=rank0)
    assert spec["environment"]["MASTER_ADDR"] == "10.9.11.254"  # its own address, as its fellows see it
    assert "ports" not in spec

    settings.INSTANCE_NETWORK_MODE = "host"  # an operator's own network: rank 0's host address, no interface named
    rank1 = launcher.Rendezvous(rank=1, hosts=hosts, master_addr="10.9.0.11", master_port=29517)
    spec = launcher.container_spec(job, node=node, shares=shares(2), rendezvous=rank1, name="member-1")
    assert spec["environment"]["MASTER_ADDR"] == "10.9.0.11" and "networking_config" not in spec
    assert "GLOO_SOCKET_IFNAME" not in spec["environment"]


def gang_of_two(user, a, b):
    job = workload(user, kind="job", gpu_count=2)
    placed = allocations_create(
        [Placement(job, a.pk, [Share(a.gpus.get().pk, 1000, 1)], rest=(Part(b.pk, [Share(b.gpus.get().pk, 1000, 1)]),))]
    )
    assert placed
    job.refresh_from_db()
    return job


def test_the_fence_lets_each_pair_of_a_gangs_members_through_both_ways_and_nothing_else(user):
    a, b, c = (make_node("sim:1xRTX3090") for _ in range(3))
    job = gang_of_two(user, a, b)
    rank0, rank1 = gang_members(job)
    assert gangs.gang_pairs(a.name) == gangs.gang_pairs(b.name) == []  # no address yet: nothing lets it through
    rank0.address = "10.9.11.254"
    rank0.save()
    assert gangs.gang_pairs(a.name) == []  # a fellow without an address yet: nothing either
    rank1.address, rank1.status = "10.9.22.254", MemberStatus.RUNNING
    rank1.save()
    comment = ["-m", "comment", "--comment", f"gang-{job.uid}"]
    pairs = gangs.gang_pairs(b.name)
    assert pairs == [("10.9.22.254", "10.9.11.254", job.uid)]
    assert gangs.filter_rules(pairs) == [
        ["-s", "10.9.22.254/32", "-d", "10.9.11.254/32", *comment, "-j", "ACCEPT"],
        ["-s", "10.9.11.254/32", "-d", "10.9.22.254/32", *comment, "-j", "ACCEPT"],
    ]
    # What rank 1 sends rank 0 leaves with its own address (no masquerade): only that direction starts here.
    assert gangs.nat_rules(pairs) == [["-s", "10.9.22.254/32", "-d", "10.9.11.254/32", *comment, "-j", "ACCEPT"]]
    assert gangs.gang_pairs(a.name) == [("10.9.11.254", "10.9.22.254", job.uid)]
    assert gangs.gang_pairs(c.name) == []
    rank1.status = MemberStatus.EXITED  # a member gone: its address is nobody's way in any more
    rank1.save()
    assert gangs.gang_pairs(a.name) == gangs.gang_pairs(b.name) == []
    rank1.status = MemberStatus.RUNNING
    rank1.save()
    job.status = WorkloadStatus.QUEUED  # the gang left its cards: its way through closes
    job.save()
    assert gangs.gang_pairs(a.name) == gangs.gang_pairs(b.name) == []


def test_a_member_gets_the_highest_free_address_of_its_hosts_tenants_network_recorded_before_it_starts(
    user, settings, monkeypatch
):
    settings.INSTANCE_SUBNET = "10.9.22.0/24"
    a, b = (make_node("sim:1xRTX3090") for _ in range(2))
    job = gang_of_two(user, a, b)
    rank0, rank1 = gang_members(job)
    monkeypatch.setattr(launcher, "network_addresses", lambda: {"10.9.22.2", "10.9.22.254"})  # Docker's
    other = workload(user, kind="job", gpu_count=2)  # another gang's member on a, holding the next one already
    WorkloadMember.objects.create(workload=other, rank=1, node=a, node_name=a.name, address="10.9.22.253")
    assert gangs.member_address_pick(rank0) == "10.9.22.252"
    rank0.refresh_from_db()
    assert rank0.address == "10.9.22.252"
    rank1.status = MemberStatus.STOPPED  # stopped while it launched: nothing is recorded
    rank1.save()
    assert gangs.member_address_pick(rank1) == ""
    rank1.refresh_from_db()
    assert rank1.address == ""


def test_the_control_plane_tells_every_members_host_and_launches_the_waiting_once_rank_0_has_its_address(
    user, monkeypatch
):
    a, b = (make_node("sim:1xRTX3090") for _ in range(2))
    job = gang_of_two(user, a, b)
    job.status = WorkloadStatus.STARTING
    job.save()
    sent = []
    monkeypatch.setattr(gang_service, "send", lambda task, *args, node: sent.append((task, args, node)))
    gang_service.gang_tell(job.pk)
    assert sent == [(ToNode.GANG_FENCE, (), a.name), (ToNode.GANG_FENCE, (), b.name)]  # rank 1 still waits
    rank0 = gang_members(job)[0]
    rank0.address = "10.9.11.254"
    rank0.save()
    sent.clear()
    gang_service.gang_tell(job.pk)
    assert sent[-1] == (ToNode.LAUNCH, (job.pk, b.name), b.name)


def test_the_fence_jumps_to_the_gangs_chain_before_its_drops():
    rules = network.fence_rules()
    jump = rules.index(["-j", gangs.CHAIN])
    assert jump == 1 and all(rule[-1] == "DROP" for rule in rules[jump + 1 : -1])


def test_on_the_fenced_network_rank_0_takes_its_address_first_and_the_others_start_knowing_it(
    user, settings, monkeypatch
):
    settings.INSTANCE_NETWORK_MODE, settings.INSTANCE_SUBNET, settings.SHARED_FS_META = "fenced", "10.9.22.0/24", ""
    a, b = (make_node("sim:1xRTX3090") for _ in range(2))
    job = gang_of_two(user, a, b)
    launched, synced = {}, []
    monkeypatch.setattr(launcher, "image_missing", lambda w: False)
    monkeypatch.setattr(network, "fence_check", lambda: None)
    monkeypatch.setattr(launcher, "network_addresses", set)
    monkeypatch.setattr(gangs, "gang_rules_sync", lambda node: synced.append((node, gangs.gang_pairs(node))))
    monkeypatch.setattr(
        launcher, "container_launch", lambda w, spec, **kw: launched.setdefault(spec["name"], spec)["name"]
    )
    monkeypatch.setattr(mps, "cards_prepare", lambda *args, **kwargs: None)
    monkeypatch.setattr(gangs, "old_members_remove", lambda *args, **kwargs: None)
    monkeypatch.setattr(collector, "settle", lambda *args, **kwargs: None)
    monkeypatch.setattr(actions, "_run_begin", lambda *args, **kwargs: 1)

    actions.agent_launch(job.pk, b.name)  # rank 1's launch came first: it waits for rank 0's address
    assert launched == {} and [m.address for m in gang_members(job)] == ["", ""]

    actions.agent_launch(job.pk, a.name)
    rank0 = gang_members(job)[0]
    assert rank0.address == "10.9.22.254" and rank0.status == MemberStatus.RUNNING
    spec = launched[job.container_name]
    assert spec["environment"]["MASTER_ADDR"] == "10.9.22.254"  # its own, known before it started
    assert spec["networking_config"][settings.INSTANCE_NETWORK]["IPAMConfig"] == {"IPv4Address": "10.9.22.254"}

    actions.agent_launch(job.pk, b.name)  # sent again once rank 0's address is recorded (gang_tell)
    rank1 = gang_members(job)[1]
    spec = launched[f"{job.container_name}-r1"]
    assert spec["environment"]["MASTER_ADDR"] == "10.9.22.254" and rank1.address == "10.9.22.254"  # (another host)
    # Its host's fence let it through to rank 0 before its container started.
    assert (b.name, [(rank1.address, rank0.address, job.uid)]) in synced
