"""The users' shared file storage for real: JuiceFS, two hosts' FUSE clients, containers on Docker.

The volume keeps its metadata and its data in PostgreSQL (two databases of the
test server, reached over TCP), as the several-host setup does. Two "hosts" are
two separate ``juicefs mount`` processes of that volume at two mount points,
each with its own cache, each feeding the containers "its" node launches: a
file goes from one container to the other only through the metadata service
and the data store. FUSE missing here fails the tests; nothing is skipped.
"""

import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from unittest import mock

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from agent import launcher
from agent import sharedfs as host_fs
from agent.actions import agent_checkpoints_remove, agent_launch, agent_release
from billing.models import Posting, PostingKind, RateCard
from billing.storage import shared_usage_sample, storage_settle
from core.messages import ToNode
from scheduler import sharedfs
from scheduler.models import Allocation, Node, NodeStatus, Workload, WorkloadStatus
from scheduler.services.allocation import Share, allocation_create
from scheduler.services.workloads import workload_release
from scheduler.sharedfs import GIB, USERS_DIR, SharedFsError
from scheduler.tasks import shared_storage_user
from tests.conftest import make_node, remove_node_containers, wait_for
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db
HOSTS = ("host1", "host2")


def _server() -> dict:
    if connection.vendor != "postgresql":
        pytest.fail("the shared storage tests keep JuiceFS's metadata and data in PostgreSQL: run on it (make test)")
    db = connection.settings_dict
    return {
        "host": db["HOST"] or "127.0.0.1",
        "port": str(db["PORT"] or 5432),
        "user": db["USER"],
        "password": db["PASSWORD"] or "",
    }


def _admin(server: dict, sql: str) -> None:
    with psycopg.connect(
        host=server["host"], port=server["port"], user=server["user"], password=server["password"], dbname="postgres"
    ) as conn:
        conn.autocommit = True
        conn.execute(sql)


@pytest.fixture(scope="module")
def volume(django_db_setup):
    """A fresh volume (metadata and data in two new databases), mounted by two hosts; all removed after."""
    if not os.path.exists(host_fs.FUSE_DEVICE):
        pytest.fail(f"FUSE is missing here ({host_fs.FUSE_DEVICE}): the shared storage needs it (modprobe fuse)")
    server = _server()
    tag = uuid.uuid4().hex[:8]
    meta_db, data_db = f"gs_{tag}_meta", f"gs_{tag}_data"
    base = Path(tempfile.mkdtemp(prefix="gs-sharedfs-"))
    auth = server["user"] + (f":{server['password']}" if server["password"] else "")
    values = {
        "SHARED_FS_META": f"postgres://{auth}@{server['host']}:{server['port']}/{meta_db}?sslmode=disable",
        "SHARED_FS_NAME": f"gs-{tag}",
        "SHARED_FS_STORAGE": "postgres",
        "SHARED_FS_BUCKET": f"{server['host']}:{server['port']}/{data_db}?sslmode=disable",
        "SHARED_FS_CACHE_MB": 256,
    }
    mounts = {host: str(base / host / "mnt") for host in HOSTS}
    created = []
    try:
        for name in (meta_db, data_db):
            _admin(server, f'CREATE DATABASE "{name}"')
            created.append(name)
        keys = {"SHARED_FS_ACCESS_KEY": server["user"], "SHARED_FS_SECRET_KEY": server["password"]}
        with override_settings(**values), mock.patch.dict(os.environ, keys):
            assert sharedfs.volume_format() is True
        for host in HOSTS:
            with override_settings(**values, **on_host(host, mounts)):
                try:
                    host_fs.mount_ensure()
                except SharedFsError as exc:
                    pytest.fail(f"{host} could not mount the shared storage: {exc.message}")
        yield {"settings": values, "mounts": mounts, "keys": keys}
    finally:
        for host in HOSTS:
            with override_settings(**values):
                try:
                    left = host_fs.unmount(mounts[host])
                except SharedFsError:
                    subprocess.run(["umount", "-l", mounts[host]], capture_output=True)
                    left = []
            for pid in left:  # a client that did not end: ours, started above
                os.kill(pid, signal.SIGKILL)
        for name in created:
            _admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shutil.rmtree(base, ignore_errors=True)


def on_host(host: str, mounts: dict) -> dict:
    """The settings of one host: its own mount point and its own local cache."""
    return {"SHARED_FS_MOUNT": mounts[host], "SHARED_FS_CACHE_DIR": str(Path(mounts[host]).parent / "cache")}


@pytest.fixture(autouse=True)
def shared_on(volume, settings):
    for key, value in {**volume["settings"], **on_host("host1", volume["mounts"])}.items():
        setattr(settings, key, value)


@pytest.fixture
def nodes():
    made = {host: make_node("sim:2xRTX3090") for host in HOSTS}
    yield made
    for node in made.values():
        remove_node_containers(node.name)


def launch(owner, node, image, host, volume) -> Workload:
    """Place a one-card instance of ``owner`` on ``node`` and launch it as ``host``'s agent does."""
    w = workload(owner, image_ref=image, cpu=1)
    card = node.gpus.filter(allocations__isnull=True).first()
    assert allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    with override_settings(**on_host(host, volume["mounts"])):
        agent_launch(w.pk)
    w.refresh_from_db()
    assert w.status == WorkloadStatus.RUNNING, w.status_reason
    return w


def run_in(w: Workload, script: str) -> tuple[int, str]:
    container = launcher.docker_client().containers.get(w.container_name)
    code, output = container.exec_run(["sh", "-c", script])
    return code, output.decode(errors="replace").strip()


def shared_source(w: Workload) -> str:
    mounts = launcher.docker_client().containers.get(w.container_name).attrs["Mounts"]
    return next(m["Source"] for m in mounts if m["Destination"] == "/root/autodl-fs")


def test_a_file_written_on_one_host_is_read_on_another_and_an_outsider_sees_none(
    user, outsider, nodes, base_image, volume
):
    mine_1 = launch(user, nodes["host1"], base_image, "host1", volume)
    assert run_in(mine_1, "echo written-on-host1 > /root/autodl-fs/note.txt") == (0, "")

    mine_2 = launch(user, nodes["host2"], base_image, "host2", volume)
    theirs = launch(outsider, nodes["host2"], base_image, "host2", volume)

    assert run_in(mine_2, "cat /root/autodl-fs/note.txt") == (0, "written-on-host1")
    # Each container is fed by its own host's mount: the file crossed between two JuiceFS clients.
    assert shared_source(mine_1) == f"{volume['mounts']['host1']}/users/{user.pk}"
    assert shared_source(mine_2) == f"{volume['mounts']['host2']}/users/{user.pk}"
    # The outsider's instance, on the same host, has its own empty directory and finds the file nowhere.
    assert run_in(theirs, "ls -A /root/autodl-fs") == (0, "")
    assert run_in(theirs, "find / -name note.txt 2>/dev/null") == (0, "")
    assert run_in(theirs, "echo mine > /root/autodl-fs/theirs.txt")[0] == 0
    assert run_in(mine_1, "ls -A /root/autodl-fs") == (0, "note.txt")


def test_the_quota_stops_a_write_past_it_and_what_is_kept_is_charged(user, nodes, base_image, volume):
    sharedfs.quota_set(user.pk, 0.05)  # 51 MiB, before the user's first launch
    w = launch(user, nodes["host1"], base_image, "host1", volume)

    assert run_in(w, "dd if=/dev/zero of=/root/autodl-fs/kept bs=1M count=30 2>&1")[0] == 0
    code, output = run_in(w, "dd if=/dev/zero of=/root/autodl-fs/big bs=1M count=40 2>&1")
    assert code != 0 and "quota exceeded" in output.lower(), output
    assert "51.2M" in run_in(w, "df -h /root/autodl-fs")[1]  # the user sees the quota as the disk's size

    # The control plane reads the usage from the metadata service (clients flush it every 3 s) ...
    used = wait_for(lambda: sharedfs.quotas().get(user.pk), what="the usage to be counted", timeout=30)
    wait_for(lambda: sharedfs.quotas()[user.pk].used_bytes >= 30 * 1024**2, what="the usage to reach 30 MiB")
    assert abs(used.quota_bytes - 0.05 * GIB) < 1024**2  # as juicefs prints it: "51 MiB"
    yesterday = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
    assert shared_usage_sample(now=yesterday + timedelta(hours=12)) >= 1
    # ... and the next day's settlement charges that day for it (no free allowance, to see 0.03 GB).
    RateCard.objects.create(
        gpu_model="", effective_from=yesterday - timedelta(days=1), storage_gb_day=Decimal(10), free_storage_gb=0
    )
    storage_settle()
    posting = Posting.objects.get(kind=PostingKind.STORAGE, debit__user=user, period_start=yesterday)
    assert posting.detail["shared_gb"] == "0.03"  # 30 MiB; the instance's disk did not exist that day
    assert posting.amount == Decimal("0.30")  # 0.03 GB x 10 per GB-day


def test_a_new_user_gets_a_directory_with_its_quota(django_user_model, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as sent:
        newcomer = django_user_model.objects.create_user("newcomer", password="newcomer-pass-1")
    assert len(sent) == 1  # the control plane is asked to make it (its queue), after the commit

    shared_storage_user(newcomer.pk)  # what the scheduler worker runs

    assert sharedfs.quotas()[newcomer.pk].quota_bytes == 20 * GIB
    sharedfs.quota_set(newcomer.pk, 100)  # an operator raises it
    assert sharedfs.user_ensure(newcomer.pk) is False  # ... and it is kept
    assert sharedfs.quotas()[newcomer.pk].quota_bytes == 100 * GIB


def test_unmounting_ends_the_hosts_client(volume, settings, tmp_path):
    settings.SHARED_FS_MOUNT = str(tmp_path / "mnt")
    settings.SHARED_FS_CACHE_DIR = str(tmp_path / "cache")
    host_fs.mount_ensure()
    try:
        pids = host_fs.client_pids(settings.SHARED_FS_MOUNT)
        assert len(pids) == 2  # its supervisor and its client
    finally:
        assert host_fs.unmount(settings.SHARED_FS_MOUNT) == []
    assert host_fs.mounted_volume(settings.SHARED_FS_MOUNT) is None
    assert not any(os.path.exists(f"/proc/{pid}/exe") for pid in pids)


def test_formatting_again_changes_nothing_and_another_volume_is_never_overwritten(settings):
    assert sharedfs.volume_format() is False
    settings.SHARED_FS_NAME = "someone-else"
    with pytest.raises(SharedFsError, match="holds the volume"):
        sharedfs.volume_format()


def test_a_deleted_file_is_gone_at_once_and_kept_in_no_trash_outside_the_quota(volume):
    # JuiceFS's trash would keep it a day in .trash, counted in no user's quota nor bill: write, delete, repeat.
    mount = Path(volume["mounts"]["host1"])
    probe = mount / USERS_DIR / "deleted.bin"
    probe.parent.mkdir(exist_ok=True)
    probe.write_bytes(os.urandom(1024**2))
    probe.unlink()

    assert [p.name for p in (mount / ".trash").rglob("*")] == []
    assert sharedfs.volume_settings()["TrashDays"] == 0


def test_a_volume_formatted_with_a_trash_has_it_turned_off_when_formatted_again(settings):
    sharedfs.juicefs("config", settings.SHARED_FS_META, "--trash-days", "1", "--yes")  # as formatted before
    assert sharedfs.volume_settings()["TrashDays"] == 1

    assert sharedfs.volume_format() is False
    assert sharedfs.volume_settings()["TrashDays"] == 0
    assert sharedfs.volume_format() is False


def test_a_host_without_fuse_says_so_and_launches_there_fail_with_why(user, nodes, base_image, settings, monkeypatch):
    monkeypatch.setattr(host_fs, "FUSE_DEVICE", "/nonexistent/fuse")
    settings.SHARED_FS_MOUNT = tempfile.mkdtemp(prefix="gs-nofuse-")
    settings.RELAY_PORT = 0  # any free port: the agent must get as far as the shared storage
    with pytest.raises(SharedFsError, match="no FUSE"):
        host_fs.mount_ensure()
    with pytest.raises(Exception, match="no FUSE"):
        call_command("node_agent", "--name", nodes["host1"].name)
    w = workload(user, image_ref=base_image, cpu=1)
    card = nodes["host1"].gpus.first()
    assert allocation_create(workload=w, node_id=nodes["host1"].pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    agent_launch(w.pk)
    w.refresh_from_db()
    assert w.status == WorkloadStatus.FAILED and "no FUSE" in w.status_reason
    os.rmdir(settings.SHARED_FS_MOUNT)


def test_an_instance_from_before_gets_the_shared_storage_at_its_next_start_with_its_disk(
    user, nodes, base_image, volume, settings
):
    settings.SHARED_FS_META = ""  # made before the shared storage existed
    w = launch(user, nodes["host1"], base_image, "host1", volume)
    assert run_in(w, "echo kept > /root/system-disk.txt; ls /root/autodl-fs")[0] != 0
    launcher.container_stop(w.container_name, grace_s=1)
    Workload.objects.filter(pk=w.pk).update(status=WorkloadStatus.STARTING)

    settings.SHARED_FS_META = volume["settings"]["SHARED_FS_META"]
    agent_launch(w.pk)

    w.refresh_from_db()
    assert w.status == WorkloadStatus.RUNNING, w.status_reason
    assert run_in(w, "cat /root/system-disk.txt; touch /root/autodl-fs/x && echo shared") == (0, "kept\nshared")


def test_a_hosts_old_shared_volume_is_copied_into_the_users_storage(user, base_image, volume, settings):
    client = launcher.docker_client()
    name = f"gpucloud-{settings.DEPLOYMENT_ID}-shared-{user.pk}"  # what /root/shared was, on each host
    old = client.volumes.create(name=name, labels={"gpucloud.deployment": settings.DEPLOYMENT_ID})
    try:
        client.containers.run(
            base_image,
            ["sh", "-c", "mkdir -p /v/data && echo old > /v/data/a.txt && echo two > /v/b.txt"],
            volumes={name: {"bind": "/v", "mode": "rw"}},
            network_mode="none",
            remove=True,
        )
        call_command("sharedfs_migrate", "--remove", "--host", "gpu7")
        copied = Path(volume["mounts"]["host1"]) / "users" / str(user.pk) / "shared-from-gpu7"
        assert (copied / "data" / "a.txt").read_text() == "old\n" and (copied / "b.txt").read_text() == "two\n"
        assert name not in {v.name for v in client.volumes.list()}
    finally:
        if name in {v.name for v in client.volumes.list()}:
            old.remove(force=True)


def test_a_jobs_auto_tmpdir_follows_it_to_another_host_under_the_quota_and_goes_when_it_is_released(
    user, nodes, base_image, volume
):
    """A single-node job checkpoints on the shared storage: launched again on another host (requeued when its host
    was lost) it finds what it saved; the folder counts against its owner's quota (and so is charged with the
    shared storage); releasing the job deletes it, seen from every host."""
    sharedfs.quota_set(user.pk, 0.05)  # 51 MiB
    job = workload(user, kind="job", image_ref=base_image, cpu=1, command=["sleep", "300"])
    place(job, nodes["host1"])
    with override_settings(**on_host("host1", volume["mounts"])):
        agent_launch(job.pk)
    job.refresh_from_db()
    assert job.status == WorkloadStatus.RUNNING, job.status_reason
    code, out = run_in(job, 'echo 42 > "$AUTO_TMPDIR/step" && echo "$AUTO_TMPDIR"')
    assert code == 0 and out == f"/root/autodl-fs/checkpoints/{job.uid}", out
    code, out = run_in(job, 'dd if=/dev/zero of="$AUTO_TMPDIR/ckpt" bs=1M count=30 2>&1')
    assert code == 0, out
    code, out = run_in(job, 'dd if=/dev/zero of="$AUTO_TMPDIR/more" bs=1M count=30 2>&1')
    assert code != 0 and "quota exceeded" in out.lower(), out  # bounded by the owner's quota
    run_in(job, 'rm -f "$AUTO_TMPDIR/more"')
    wait_for(lambda: sharedfs.quotas()[user.pk].used_bytes >= 30 * 1024**2, what="the checkpoint to be counted")

    # Its host is lost: the job is placed again on another host, whose own JuiceFS client serves it.
    launcher.container_stop(job.container_name, grace_s=1)
    launcher.container_delete(job.container_name)
    Allocation.objects.filter(workload=job).delete()
    Workload.objects.filter(pk=job.pk).update(status=WorkloadStatus.QUEUED, node=None)
    place(job, nodes["host2"])
    with override_settings(**on_host("host2", volume["mounts"])):
        agent_launch(job.pk)
        job.refresh_from_db()
        assert job.status == WorkloadStatus.RUNNING, job.status_reason
        assert run_in(job, 'cat "$AUTO_TMPDIR/step"; wc -c < "$AUTO_TMPDIR/ckpt"') == (0, f"42\n{30 * 1024**2}")
        assert shared_source(job) == f"{volume['mounts']['host2']}/users/{user.pk}"

        launcher.container_stop(job.container_name, grace_s=1)
        Workload.objects.filter(pk=job.pk).update(status=WorkloadStatus.SUCCEEDED)
        job.refresh_from_db()
        workload_release(job)  # the owner, or housekeeping once it has ended HOUSEKEEPING_DAYS ago
        agent_release(job.pk)  # host2's agent
    job.refresh_from_db()
    assert job.status == WorkloadStatus.RELEASED
    for host in HOSTS:
        gone = Path(volume["mounts"][host]) / "users" / str(user.pk) / "checkpoints" / job.uid
        wait_for(lambda gone=gone: not gone.exists(), what=f"{host} to see it gone", timeout=5)  # 1 s metadata cache
    wait_for(lambda: sharedfs.quotas()[user.pk].used_bytes < 1024**2, what="the usage to fall with the folder")


def test_a_job_released_while_its_host_is_lost_has_its_checkpoints_removed_by_another_host(
    user, nodes, base_image, volume, django_capture_on_commit_callbacks
):
    job = workload(user, kind="job", image_ref=base_image, cpu=1, command=["sleep", "300"])
    folder = Path(host_fs.checkpoint_dir_ensure(user.pk, job.uid))  # host1's mount
    (folder / "last.ckpt").write_text("weights")
    Workload.objects.filter(pk=job.pk).update(status=WorkloadStatus.FAILED, node=nodes["host1"])
    Node.objects.filter(pk=nodes["host1"].pk).update(status=NodeStatus.LOST)
    job.refresh_from_db()
    with mock.patch("core.messages.send") as send, django_capture_on_commit_callbacks(execute=True):
        workload_release(job)
    job.refresh_from_db()
    assert job.status == WorkloadStatus.RELEASED
    (task, *args), options = send.call_args  # after the commit, to the other host, which is active
    assert task == ToNode.CHECKPOINTS_REMOVE and options["node"] == nodes["host2"].name, send.call_args
    with override_settings(**on_host("host2", volume["mounts"])):
        agent_checkpoints_remove(*args)  # host2's agent
    wait_for(lambda: not folder.exists(), what="host1 to see the folder gone", timeout=5)  # its 1 s metadata cache


def test_a_checkpoints_removal_for_a_job_that_is_not_released_leaves_them(user, outsider, volume):
    job = workload(user, kind="job", status=WorkloadStatus.QUEUED)  # preempted: it resumes from its checkpoint
    Path(host_fs.checkpoint_dir_ensure(user.pk, job.uid), "last.ckpt").write_text("weights")
    with override_settings(**on_host("host2", volume["mounts"])):
        agent_checkpoints_remove(user.pk, job.uid)  # a stale message, or one another host forged
        Workload.objects.filter(pk=job.pk).update(status=WorkloadStatus.RELEASED)
        agent_checkpoints_remove(outsider.pk, job.uid)  # the uid of someone else's job
        kept = Path(host_fs.checkpoint_dir_on_host(user.pk, job.uid), "last.ckpt")  # host2's own view: at once
        assert kept.read_text() == "weights"
        agent_checkpoints_remove(user.pk, job.uid)  # released now: they go
        assert not kept.parent.exists()


def place(job: Workload, node) -> None:
    card = node.gpus.filter(allocations__isnull=True).first()
    assert allocation_create(workload=job, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])


def test_a_mount_that_stops_answering_loses_its_client_and_nothing_it_held_lands(volume, settings, tmp_path):
    """The self-fence's second half: a host cut off from the metadata service (here its client stopped: it answers
    nothing, as when it retries an unreachable service) has its client killed; a write hung in the kernel fails
    then, and never lands."""
    settings.SHARED_FS_MOUNT = str(tmp_path / "mnt")
    settings.SHARED_FS_CACHE_DIR = str(tmp_path / "cache")
    point = host_fs.mount_ensure()
    writer = None
    try:
        assert host_fs.client_drop_if_stuck(point, wait_s=2) == []  # it answers: left alone
        pids = host_fs.client_pids(point)
        assert host_fs.client_processes(point) == pids  # the supervisor first, found without asking the mount
        os.kill(pids[-1], signal.SIGSTOP)
        late = f"late-{uuid.uuid4().hex}.txt"
        writer = subprocess.Popen(["sh", "-c", f"echo late > {point}/{late}"], stderr=subprocess.PIPE, text=True)
        wchan = Path(f"/proc/{writer.pid}/wchan")
        # In the kernel, waiting on the stopped client: before that, the kill would find no request to abort and the
        # write would fail on a mount already gone (ENOTCONN) — a different path.
        wait_for(
            lambda: wchan.read_text() in ("request_wait_answer", "fuse_wait_answer"),
            what="the write to wait on the client",
            timeout=10,
        )

        assert host_fs.client_drop_if_stuck(point, wait_s=1) == pids

        assert writer.wait(timeout=10) != 0, "the write went through"
        assert "connection abort" in writer.stderr.read()  # ECONNABORTED: the request it was in is gone
        assert not any(os.path.exists(f"/proc/{pid}/exe") for pid in pids)
    finally:
        if writer is not None and writer.poll() is None:
            writer.kill()
        subprocess.run(["umount", "-l", point], capture_output=True)
    assert not (Path(volume["mounts"]["host1"]) / late).exists()  # another host's view of the volume
    # The next launch mounts it again.
    host_fs.mount_ensure()
    assert os.listdir(point) is not None
    host_fs.unmount(point)


def test_a_host_cut_off_inside_a_metadata_transaction_holds_its_files_no_longer_than_the_limit(volume, settings):
    """JuiceFS changes a file's metadata in a transaction (its row updated, then its chunks, then COMMIT). A host
    cut off in the middle leaves its session idle in that transaction, the row locked: PostgreSQL ends it after
    SHARED_FS_META_IDLE_TX_S (set by formatting), so another host's write to the file (a requeued job's
    checkpoint) waits that long, not the hours TCP takes to give up on the lost host."""
    settings.SHARED_FS_META_IDLE_TX_S = 2
    assert sharedfs.metadata_idle_limit() is True  # as `manage.py sharedfs_format` does
    step = Path(volume["mounts"]["host1"]) / f"step-{uuid.uuid4().hex}"
    step.write_text("7\n")
    writer = None
    # The lost host's session, as a truncate leaves it after its first statement.
    lost = psycopg.connect(volume["settings"]["SHARED_FS_META"])
    try:
        held = lost.execute("UPDATE jfs_node SET length = 0 WHERE inode = %s", (step.stat().st_ino,))
        assert held.rowcount == 1
        on_host2 = Path(volume["mounts"]["host2"]) / step.name
        writer = subprocess.Popen(["sh", "-c", f"echo 8 > {on_host2}"], stderr=subprocess.PIPE, text=True)
        assert writer.wait(timeout=30) == 0, writer.stderr.read()  # hours without the limit
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            lost.execute("SELECT 1")
        wait_for(lambda: step.read_text() == "8\n", what="host1 to read host2's write", timeout=10)
    finally:
        if writer is not None and writer.poll() is None:
            writer.kill()
        lost.close()
        settings.SHARED_FS_META_IDLE_TX_S = 10
        sharedfs.metadata_idle_limit()
