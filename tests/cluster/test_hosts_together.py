"""What only several real hosts can show: files that follow the user, instances that move with their
disks, tenants fenced off from the control plane and the other hosts with Docker's iptables on, and a
host cut off from the control plane that stops its own job before the job runs elsewhere."""

import json
import re
import subprocess
from contextlib import contextmanager

import pytest

from tests.cluster.harness import wait_until

pytestmark = pytest.mark.cluster


def container_of(cluster, instance: dict):
    return cluster.engine(int(instance["node"][1:])).containers.get(instance["container_id"])


def run_in(container, script: str) -> tuple[int, str]:
    result = container.exec_run(["sh", "-c", script])
    return result.exit_code, result.output.decode(errors="replace")


def in_host(cluster, i: int, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["nsenter", f"--net={cluster.host_netns(i)}", *command], capture_output=True, text=True, timeout=60
    )


@contextmanager
def node_held_back(cluster, name: str):
    """Nothing new is placed on ``name`` meanwhile (an operator's drain), so that work lands elsewhere."""
    cluster.sql("UPDATE scheduler_node SET status = 'draining' WHERE name = %s", (name,))
    try:
        yield
    finally:
        # (an empty draining node is drained by the next reconciliation)
        cluster.sql(
            "UPDATE scheduler_node SET status = 'active' WHERE name = %s AND status IN ('draining', 'drained')", (name,)
        )


def test_a_file_written_by_an_instance_on_host_1_is_read_by_one_on_host_2(cluster):
    on_h1 = cluster.wait_instance(cluster.create_instance("RTX3090")["id"], "running")
    on_h2 = cluster.wait_instance(cluster.create_instance("A100-80GB")["id"], "running")
    try:
        assert on_h2["node"] == "h2" and on_h1["node"] in ("h1", "h3")
        code, out = run_in(container_of(cluster, on_h1), "echo written-on-one-host > /root/autodl-fs/note.txt")
        assert code == 0, out
        code, out = run_in(container_of(cluster, on_h2), "cat /root/autodl-fs/note.txt; df -P /root/autodl-fs")
        assert code == 0 and "written-on-one-host" in out and "JuiceFS" in out, out
    finally:
        cluster.release(on_h1["id"])
        cluster.release(on_h2["id"])


def test_a_stopped_instance_moves_to_another_host_with_its_system_and_data_disks(cluster):
    instance = cluster.wait_instance(cluster.create_instance("RTX3090")["id"], "running")
    source = instance["node"]
    code, out = run_in(
        container_of(cluster, instance),
        "head -c 8388608 /dev/urandom > /root/autodl-tmp/data.bin && echo kept > /root/system.txt"
        " && sha256sum /root/autodl-tmp/data.bin",
    )
    assert code == 0, out
    digest = out.split()[0]
    # This instance's own container and data disk on the source (the cluster is shared with other tests' work).
    before = container_of(cluster, instance)
    workload_label = before.labels["gpucloud.workload"]
    data_volumes = {m["Name"] for m in before.attrs["Mounts"] if m.get("Name", "").startswith("gpucloud-data-")}
    assert data_volumes, before.attrs["Mounts"]
    cluster.action(instance["id"], "stop")
    cluster.wait_instance(instance["id"], "stopped")

    response = cluster.api("post", f"instances/{instance['id']}/move/")
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "moving"
    moved = cluster.wait_instance(instance["id"], "stopped", timeout=120)
    target = "h3" if source == "h1" else "h1"
    assert f"moved from {source} to {target}" in moved["status_reason"]

    cluster.action(instance["id"], "start")
    running = cluster.wait_instance(instance["id"], "running")
    try:
        assert running["node"] == target
        code, out = run_in(container_of(cluster, running), "sha256sum /root/autodl-tmp/data.bin; cat /root/system.txt")
        assert code == 0 and digest in out and "kept" in out, out
        old = cluster.engine(int(source[1:]))
        assert not [c for c in old.containers.list(all=True) if c.labels.get("gpucloud.workload") == workload_label]
        assert not [v for v in old.volumes.list() if v.name in data_volumes]
    finally:
        cluster.release(instance["id"])


def test_a_tenant_reaches_no_control_plane_service_no_other_host_and_no_other_tenant(cluster):
    """Docker's iptables are on in every host: the fence sits in DOCKER-USER, ahead of Docker's ACCEPTs."""
    tenant = cluster.wait_instance(cluster.create_instance("RTX3090")["id"], "running")
    neighbour = cluster.wait_instance(cluster.create_instance("A100-80GB")["id"], "running")
    try:
        host = int(tenant["node"][1:])
        control_plane = cluster.info["CONTROL_PLANE"] if "CONTROL_PLANE" in cluster.info else f"10.{cluster.net}.0.1"
        other_tenant = container_of(cluster, neighbour).attrs["NetworkSettings"]["Networks"]["gpucloud-tenants"]
        targets = {
            "PostgreSQL": (control_plane, 5432),
            "Redis": (control_plane, 6379),
            "web": (control_plane, 8000),
            "registry": (control_plane, 5000),
            "host 2's relay": (cluster.host_address(2), 8470),
            "another host's tenant": (other_tenant["IPAddress"], 22),
        }
        probe = "nc -w 3 {0} {1} </dev/null >/dev/null 2>&1 && echo open || echo closed"
        for what, (address, port) in targets.items():
            if what != "another host's tenant":  # (its container listens nowhere: the host check is the point)
                reached = in_host(cluster, host, "bash", "-c", f"exec 3<>/dev/tcp/{address}/{port}")
                assert reached.returncode == 0, f"the host itself should reach {what}: {reached.stderr}"
            code, out = run_in(container_of(cluster, tenant), probe.format(address, port))
            assert out.strip() == "closed", f"a tenant reached {what} at {address}:{port}"
        fence = in_host(cluster, host, "iptables", "-S", "DOCKER-USER")
        assert fence.stdout.splitlines()[1].endswith("-j GPUCLOUD-FENCE"), fence.stdout  # first, ahead of Docker's
    finally:
        cluster.release(tenant["id"])
        cluster.release(neighbour["id"])


def test_nobody_on_the_lan_reaches_a_tenant_on_a_port_it_did_not_publish(cluster):
    """Issue 31 §2: the hosts forward what is routed to their tenants' subnet, so the fence drops what enters the
    bridge new and untranslated. From the control plane with a route to the tenant's subnet via its host (what any
    machine on the LAN can add), and from another host (which has that route for the gangs): nothing reaches a
    listener on an unpublished port. Its own host does (the listener is up: the refusals are the fence's)."""
    tenant = cluster.wait_instance(cluster.create_instance("RTX3090")["id"], "running")
    host = int(tenant["node"][1:])
    other = next(i for i in (1, 2, 3) if i != host)
    container = container_of(cluster, tenant)
    address = container.attrs["NetworkSettings"]["Networks"]["gpucloud-tenants"]["IPAddress"]
    container.exec_run(["sh", "-c", "nc -ll -p 7777 -e echo listening"], detach=True)
    probe = f"nc -w 3 {address} 7777 </dev/null 2>/dev/null || true"
    route = ["ip", "route", "replace", cluster.tenant_subnet(host), "via", cluster.host_address(host)]
    try:
        wait_until(
            lambda: "listening" in in_host(cluster, host, "busybox", "sh", "-c", probe).stdout,
            timeout=15,
            what="the tenant's listener, from its own host",
        )
        assert in_host(cluster, other, "busybox", "sh", "-c", probe).stdout.strip() == "", f"h{other} reached it"
        subprocess.run(route, check=True, capture_output=True)
        reached = subprocess.run(["busybox", "sh", "-c", probe], capture_output=True, text=True, timeout=30)
        assert reached.stdout.strip() == "", "the control plane's side of the LAN reached it"
    finally:
        subprocess.run(["ip", "route", "del", cluster.tenant_subnet(host)], capture_output=True)
        cluster.release(tenant["id"])


# A training loop in sh: each step is done once its counter is saved in AUTO_TMPDIR (written whole, then renamed
# over the last), then logged with the run that did it; a run starts from the counter it finds there.
STEPS = r"""
ck="$AUTO_TMPDIR"; run=$(cut -c1-8 /proc/sys/kernel/random/uuid)
n=0; [ -s "$ck/step" ] && n=$(cat "$ck/step")
echo "run $run resumes from step $n"
while :; do
  n=$((n + 1)); sleep 0.1
  echo $n > "$ck/step.new" && mv -f "$ck/step.new" "$ck/step" && echo "$run $n" >> "$ck/steps"
done
"""


def counter(container) -> int:
    code, out = run_in(container, 'cat "$AUTO_TMPDIR/step" 2>/dev/null || echo 0')
    return int(out.strip() or 0) if code == 0 else 0


def test_a_host_cut_off_stops_its_job_before_it_runs_elsewhere_and_keeps_its_instance_uncharged_while_cut_off(cluster):
    """...and the job, single-node, resumes on the other host from the step it had reached: its AUTO_TMPDIR is on
    the shared storage, not on the host that was lost."""
    spare = "h3"
    with node_held_back(cluster, spare):  # both land on h1
        instance = cluster.wait_instance(cluster.create_instance("RTX3090")["id"], "running")
        job = cluster.api("post", "jobs/", json=cluster.work_body("RTX3090", command=STEPS))
        assert job.status_code == 201, job.text
        job_id = job.json()["id"]
        wait_until(
            lambda: cluster.api("get", f"jobs/{job_id}/").json()["status"] == "running",
            timeout=60,
            what="the job to run",
        )
    assert instance["node"] == "h1"
    workload = cluster.sql("SELECT workload_id FROM portal_job WHERE id = %s", (job_id,))[0][0]
    old_container = cluster.sql("SELECT container_id FROM scheduler_workload WHERE id = %s", (workload,))[0][0]
    on_h1 = cluster.engine(1).containers.get(old_container)
    code, out = run_in(on_h1, 'echo "$AUTO_TMPDIR"; df -P "$AUTO_TMPDIR"')
    assert code == 0 and "/root/autodl-fs/checkpoints/" in out and "JuiceFS" in out, out
    wait_until(lambda: counter(on_h1) >= 10, timeout=30, what="the job to do 10 steps on h1")
    cut = ["iptables", "-I", "OUTPUT", "-d", f"10.{cluster.net}.0.1", "-j", "DROP"]
    assert in_host(cluster, 1, *cut).returncode == 0
    try:
        # The control plane calls h1 lost and requeues the job; h3 runs it.
        def running_on():
            rows = cluster.sql(
                "SELECT n.name FROM scheduler_workload w JOIN scheduler_node n ON n.id = w.node_id "
                "WHERE w.id = %s AND w.status = 'running'",
                (workload,),
            )
            return rows and rows[0][0]

        try:
            wait_until(lambda: running_on() == spare, timeout=90, what="the job running again on the other host")
        except AssertionError:
            history = cluster.sql(
                "SELECT from_status, to_status, reason FROM scheduler_workloadevent WHERE workload_id = %s ORDER BY id",
                (workload,),
            )
            nodes = cluster.sql("SELECT name, status FROM scheduler_node ORDER BY name")
            raise AssertionError(f"the job did not run again on {spare}: {history}; nodes {nodes}") from None
        assert cluster.sql("SELECT status FROM scheduler_node WHERE name = 'h1'")[0][0] == "lost"
        stopped = cluster.engine(1).containers.get(old_container).attrs["State"]
        new_container = cluster.sql("SELECT container_id FROM scheduler_workload WHERE id = %s", (workload,))[0][0]
        started = cluster.engine(3).containers.get(new_container).attrs["State"]
        assert not stopped["Running"]
        assert stopped["FinishedAt"] < started["StartedAt"]  # h1 had stopped it before h3 started it
        # It resumed on h3 from the step it had saved on h1, and no step was done twice: in the order the two
        # runs logged them, h1's steps 1..a, then h3's from a + 1 (a + 2 when h1 was cut off between saving
        # step a + 1 and logging it), one by one.
        on_h3 = cluster.engine(3).containers.get(new_container)
        said = wait_until(
            lambda: re.search(r"run (\w+) resumes from step (\d+)", on_h3.logs().decode()), timeout=30, what="h3's run"
        )
        resumed = int(said.group(2))
        try:
            # h1 may have been cut off inside a metadata transaction, holding its rows: PostgreSQL ends that
            # session after SHARED_FS_META_IDLE_TX_S (10 s), and h3's writes go on.
            wait_until(lambda: counter(on_h3) >= resumed + 5, timeout=30, what="five steps on h3")
        except AssertionError:
            on_h3.reload()
            held = cluster.sql(
                "SELECT usename, state, now() - state_change FROM pg_stat_activity WHERE datname = 'gpucloud_fs_meta'"
            )
            raise AssertionError(
                f"h3's run did not get 5 steps past {resumed} (at {counter(on_h3)}; container {on_h3.status}); "
                f"its log ends {on_h3.logs()[-600:]!r}; metadata sessions {held}"
            ) from None
        steps = steps_of(on_h3)
        runs = list(dict.fromkeys(run for run, _ in steps))
        assert len(runs) == 2 and runs[1] == said.group(1), steps
        first = [n for run, n in steps if run == runs[0]]
        again = [n for run, n in steps if run == runs[1]]
        assert steps == [(runs[0], n) for n in first] + [(runs[1], n) for n in again]  # never interleaved
        assert first == list(range(1, len(first) + 1)), first  # h1's run, before the cut
        assert resumed >= 10 and resumed in (first[-1], first[-1] + 1), (resumed, first)  # from its checkpoint
        assert again == list(range(resumed + 1, resumed + 1 + len(again))), again
        # The instance ran on: h1 still runs it (uncharged while h1 cannot be heard).
        assert container_of(cluster, instance).status == "running"
        assert (
            cluster.sql(
                "SELECT status FROM scheduler_workload w JOIN portal_instance i ON i.workload_id = w.id "
                "WHERE i.id = %s",
                (instance["id"],),
            )[0][0]
            == "running"
        )
    finally:
        in_host(cluster, 1, "iptables", "-D", "OUTPUT", "-d", f"10.{cluster.net}.0.1", "-j", "DROP")
    wait_until(
        lambda: cluster.sql("SELECT status FROM scheduler_node WHERE name = 'h1'")[0][0] == "active",
        timeout=90,
        what="h1 to rejoin",
    )
    # Nothing of h1's run landed late, once h1 reached the storage again: the steps only went on on h3.
    later = steps_of(on_h3)
    assert later[: len(steps)] == steps and {run for run, _ in later[len(steps) :]} == {runs[1]}, later

    def segments():
        return cluster.sql(
            "SELECT s.ended_at IS NULL FROM billing_metersegment s "
            "JOIN portal_instance i ON i.workload_id = s.workload_id WHERE i.id = %s ORDER BY s.started_at",
            (instance["id"],),
        )

    # One run, not charged while h1 was unreachable: closed at h1's last heartbeat, charged again once it rejoined
    # (its agent opens the segment right after the rejoin commits).
    wait_until(lambda: len(segments()) == 2, timeout=10, what="the instance's meter to resume")
    assert segments() == [(False,), (True,)]
    assert cluster.instance(instance["id"])["status"] == "running"
    cluster.api("post", f"jobs/{job_id}/cancel/")
    cluster.release(instance["id"])


def steps_of(container) -> list[tuple[str, int]]:
    code, out = run_in(container, 'cat "$AUTO_TMPDIR/steps"')
    assert code == 0, out
    return [(run, int(n)) for run, n in (line.split() for line in out.splitlines() if line.strip())]


def test_the_logs_of_jobs_on_two_hosts_at_once_are_whole_and_in_order(cluster):
    """Each host keeps its own logs (its own state directory, as real hosts have their own disks): a host's
    collector never closes another host's runs, so two jobs printing at once on two hosts read back whole,
    in order, with no "removed before its output was read" note while they ran."""
    lines = 120
    command = f"for i in $(seq 1 {lines}); do echo line $i; sleep 0.05; done"
    jobs = []
    for gpu_type in ("RTX3090", "A100-80GB"):  # h1 or h3, and h2
        response = cluster.api("post", "jobs/", json=cluster.work_body(gpu_type, 1, command=command))
        assert response.status_code == 201, response.text
        jobs.append(response.json())

    def read(job) -> list[dict]:
        response = cluster.api("get", f"jobs/{job['id']}/logs/", params={"format": "ndjson"})
        assert response.status_code == 200, response.text
        return [json.loads(line) for line in response.text.splitlines()]  # every line whole JSON

    def done() -> bool:
        for job in jobs:
            read(job)  # followed while they run: each read must parse
        states = [cluster.api("get", f"jobs/{job['id']}/").json()["status"] for job in jobs]
        assert "failed" not in states, states
        return all(state == "succeeded" for state in states)

    wait_until(done, timeout=120, what="both jobs to finish", every=1.0)
    nodes = {cluster.api("get", f"jobs/{job['id']}/").json()["node"] for job in jobs}
    assert len(nodes) == 2, nodes
    for job in jobs:
        records = read(job)
        output = [r["line"] for r in records if r.get("stream") == "stdout"]
        assert output == [f"line {i}" for i in range(1, lines + 1)]
        cursors = [r["n"] for r in records if "n" in r]
        assert len(cursors) == len(set(cursors)) and cursors == sorted(cursors)
        assert not [r for r in records if "removed before" in r.get("line", "")]
