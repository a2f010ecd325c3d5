"""A job over two hosts (a gang), for real: its members find each other through MASTER_ADDR:MASTER_PORT across
hosts and all-reduce; each reaches the other at its container's address on a port of its own, both ways, seen
with its own address, and no other tenant's container reaches them; one member's host is cut off; the gang is
requeued as one and resumes from its checkpoint on the shared storage, on other hosts; its way through the
fences is gone once it ended.

The images here have no PyTorch (and no Python: they are busybox stand-ins), so the all-reduce is a small TCP
one in sh with busybox's nc that reads exactly the contract torchrun reads: NODE_RANK, NNODES, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, plus the hostfile and AUTO_TMPDIR. Rank 0 gathers every member's value on
MASTER_PORT, sums, and sends the sum back to each (a star all-reduce, what a TCP store does).
"""

import json
import shutil
import statistics
import subprocess
import sys
import tempfile

import pytest

from tests.cluster.harness import wait_until
from tests.cluster.test_hosts_together import in_host, run_in

pytestmark = pytest.mark.cluster

ALL_REDUCE = r"""
ck="$AUTO_TMPDIR"; mkdir -p "$ck"
resumed=0; [ -f "$ck/step" ] && resumed=$(cat "$ck/step")
v=$((NODE_RANK + 1))
echo "rank $NODE_RANK of $NNODES (world $WORLD_SIZE) at $MASTER_ADDR:$MASTER_PORT, resumed from step $resumed"
cat "$GPUCLOUD_HOSTFILE"
if [ "$NODE_RANK" = 0 ]; then
  printf 'read v; echo $v >> /tmp/vals; echo ok\n' > /tmp/gather; printf 'cat /tmp/sum\n' > /tmp/bcast
  chmod +x /tmp/gather /tmp/bcast; : > /tmp/vals
  for i in $(seq 2 $NNODES); do nc -l -p "$MASTER_PORT" -e /tmp/gather; done
  sum=$v; for x in $(cat /tmp/vals); do sum=$((sum + x)); done
  echo $sum > /tmp/sum
  for i in $(seq 2 $NNODES); do nc -l -p "$MASTER_PORT" -e /tmp/bcast; done
else
  until [ "$(echo $v | nc -w 3 "$MASTER_ADDR" "$MASTER_PORT")" = ok ]; do sleep 0.5; done
  sum=""; until [ -n "$sum" ]; do sum=$(nc -w 3 "$MASTER_ADDR" "$MASTER_PORT" </dev/null); sleep 0.2; done
fi
echo "allreduce sum=$sum"
[ "$NODE_RANK" = 0 ] && echo $((resumed + 1)) > "$ck/step"
if [ "$resumed" = 0 ]; then
  trap 'echo "SIGTERM: the checkpoint is kept"; exit 143' TERM
  while :; do sleep 1; done
fi
echo "finished after resuming from step $resumed"
"""


def gang_state(cluster, job_id: int) -> dict:
    return cluster.api("get", f"jobs/{job_id}/").json()


def member_container(cluster, uid: str, member: dict):
    name = f"gpucloud-job-{uid}" + (f"-r{member['rank']}" if member["rank"] else "")
    return cluster.engine(int(member["node"][1:])).containers.get(name)


def member_logs(cluster, uid: str, member: dict) -> str:
    return member_container(cluster, uid, member).logs().decode(errors="replace")


def tenant_address(container) -> str:
    return container.attrs["NetworkSettings"]["Networks"]["gpucloud-tenants"]["IPAddress"]


# A listener on a port of the member's choosing that answers each connection with the address it sees it from
# (the connection is half-closed by then: the client's stdin is empty).
WHO = r"""
echo 'netstat -tn | awk '"'"'$4 ~ /:{port}$/ && $6 ~ /ESTABLISHED|CLOSE_WAIT/ {print $5}'"'"'' > /tmp/who
chmod +x /tmp/who; nc -ll -p {port} -e /tmp/who
"""
# What the listener at {0}:{1} answers (nothing when it cannot be reached within 3 s).
SEEN = "nc -w 3 {0} {1} </dev/null 2>/dev/null || true"
MB = 200
ZEROS = f"mkdir -p {{0}} && dd if=/dev/zero of={{0}}/z bs=1M count={MB} 2>/dev/null"


def rate(seconds: float) -> str:
    return f"{MB / max(seconds, 0.01):.0f} MB/s"


def timed_get(run, url: str) -> float:
    """Seconds for a wget of ``url`` (MB megabytes) run by ``run(script) -> (code, output)``, timed where it runs
    (busybox time, 10 ms steps); it must arrive whole."""
    code, out = run(f"busybox time -f %e sh -c 'wget -q -O - {url} | wc -c' 2>&1")
    size, seconds = out.strip().splitlines()[-2:]
    assert int(size) == MB * 1024 * 1024, out
    return float(seconds)


def interface_of(container, address: str) -> str:
    """The name of the container's interface that holds ``address`` (busybox ifconfig's blocks)."""
    blocks = run_in(container, "ifconfig")[1].split("\n\n")
    return next(block.split()[0] for block in blocks if f"inet addr:{address} " in block)


def raw_tcp(cluster, containers, addresses, hosts, rounds: int = 3) -> tuple[list[float], list[float]]:
    """Seconds for MB megabytes over TCP from rank 0's container to rank 1's, and from rank 0's host to rank 1's
    (busybox httpd and wget on both), ``rounds`` of each, taken in turn."""
    code, out = run_in(containers[0], ZEROS.format("/dev/shm/www") + " && httpd -p 41200 -h /dev/shm/www && echo on")
    assert code == 0 and "on" in out, out
    folder = tempfile.mkdtemp(dir="/dev/shm")
    subprocess.run(["sh", "-c", ZEROS.format(folder)], check=True)
    address = cluster.host_address(hosts[0])
    server = subprocess.Popen(
        ["nsenter", f"--net={cluster.host_netns(hosts[0])}", "busybox", "httpd", "-f", "-p", f"{address}:41201"]
        + ["-h", folder]
    )

    def on_host(script):
        done = in_host(cluster, hosts[1], "busybox", "sh", "-c", script)
        return done.returncode, done.stdout

    members, between_hosts = [], []
    try:
        wait_until(
            lambda: f"{address}:41201 " in in_host(cluster, hosts[0], "busybox", "netstat", "-ltn").stdout,
            timeout=10,
            what="the host's server",
        )
        for _ in range(rounds):
            members.append(timed_get(lambda script: run_in(containers[1], script), f"http://{addresses[0]}:41200/z"))
            between_hosts.append(timed_get(on_host, f"http://{address}:41201/z"))
    finally:
        server.kill()
        server.wait(10)
        shutil.rmtree(folder, ignore_errors=True)
    return members, between_hosts


@pytest.mark.timeout(600)  # the cluster's start (the session's fixture) counts too
def test_a_gang_all_reduces_across_two_hosts_and_resumes_as_one_after_a_members_host_is_cut_off(cluster):
    cluster.add_host(5, "sim:4xRTX3090")  # a third host of RTX 3090s (with h1 and h3) to resume on
    body = cluster.work_body("RTX3090", gpus=2, nodes=2, command=ALL_REDUCE)
    response = cluster.api("post", "jobs/", json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    workload, uid = cluster.sql(
        "SELECT w.id, w.uid FROM scheduler_workload w JOIN portal_job j ON j.workload_id = w.id WHERE j.id = %s",
        (job_id,),
    )[0]

    def running():
        state = gang_state(cluster, job_id)
        return state if state["status"] == "running" else None

    first = wait_until(running, timeout=90, what="the gang running on two hosts")
    members = first["members"]
    assert [m["rank"] for m in members] == [0, 1] and members[0]["node"] != members[1]["node"]
    assert first["node"] == members[0]["node"]
    wait_until(
        lambda: all("allreduce sum=3" in member_logs(cluster, uid, m) for m in members),
        timeout=60,
        what="both members to finish the all-reduce",
    )
    hosts = [int(m["node"][1:]) for m in members]
    containers = [member_container(cluster, uid, m) for m in members]
    addresses = [tenant_address(c) for c in containers]
    rank0_log, rank1_log = (member_logs(cluster, uid, m) for m in members)
    # MASTER_ADDR is rank 0's container address, for rank 0 itself too; the hostfile names the hosts.
    assert f"rank 1 of 2 (world 2) at {addresses[0]}:" in rank1_log, rank1_log
    assert f"rank 0 of 2 (world 2) at {addresses[0]}:" in rank0_log, rank0_log
    assert f"{cluster.host_address(hosts[0])} slots=1\n{cluster.host_address(hosts[1])} slots=1" in rank1_log
    env = dict(line.split("=", 1) for line in run_in(containers[1], "env")[1].splitlines() if "=" in line)
    interface = interface_of(containers[1], addresses[1])
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == interface == "eth0", (env, interface)
    assert {"RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"}.isdisjoint(env)

    # Each member listens on a port of its own (not MASTER_PORT); the other connects at its container's address
    # and is seen there with its own container's address, both ways.
    master_port = cluster.sql("SELECT master_port FROM scheduler_workload WHERE id = %s", (workload,))[0][0]
    ports = [41000 + rank for rank in (0, 1)]
    assert master_port not in ports
    for container, port in zip(containers, ports, strict=True):
        container.exec_run(["sh", "-c", WHO.replace("{port}", str(port))], detach=True)
    for container, port in zip(containers, ports, strict=True):
        wait_until(lambda c=container, p=port: f":{p} " in run_in(c, "netstat -ltn")[1], timeout=10, what="listeners")
    for me, other in ((0, 1), (1, 0)):
        seen = run_in(containers[me], SEEN.format(addresses[other], ports[other]))[1].strip()
        seen_as = seen.removeprefix("::ffff:").rsplit(":", 1)[0]  # (an IPv6 listener shows IPv4 peers mapped)
        assert seen_as == addresses[me], f"rank {other} saw rank {me} as {seen!r}, not {addresses[me]}"
    # Exactly the pair, both ways, on each side; and no masquerade for what a member sends its fellow.
    for rank, host in enumerate(hosts):
        mine, fellow = addresses[rank], addresses[1 - rank]
        way = [r for r in in_host(cluster, host, "iptables", "-S", "GPUCLOUD-GANGS").stdout.splitlines() if "-A" in r]
        assert len(way) == 2 and f"-s {mine}/32 -d {fellow}/32" in way[0] and f"-s {fellow}/32 -d {mine}/32" in way[1]
        nat = in_host(cluster, host, "iptables", "-t", "nat", "-S", "GPUCLOUD-GANGS").stdout
        assert [r for r in nat.splitlines() if "-A" in r][0].startswith(
            f"-A GPUCLOUD-GANGS -s {mine}/32 -d {fellow}/32"
        )

    # Another tenant's container on either host reaches neither listener.
    for host in hosts:
        outsider = cluster.engine(host).containers.run(
            containers[0].image.id,
            ["sh", "-c", " ; ".join(SEEN.format(a, p) + " ; echo ." for a, p in zip(addresses, ports, strict=True))],
            network="gpucloud-tenants",
            detach=True,
        )
        try:
            assert outsider.wait(timeout=30)["StatusCode"] == 0
            assert outsider.logs().decode().split() == [".", "."], f"a tenant on h{host} reached a member"
        finally:
            outsider.remove(force=True)
    # Nor does the other member's host itself (it reaches its own containers only).
    for rank, host in enumerate(hosts):
        other = 1 - rank
        reached = in_host(cluster, host, "busybox", "sh", "-c", SEEN.format(addresses[other], ports[other]))
        assert reached.stdout.strip() == "", f"h{host} reached rank {other}'s listener on h{hosts[other]}"

    # Raw TCP between the two members' containers, against the same between their two hosts (busybox on both).
    between_members, between_hosts = raw_tcp(cluster, containers, addresses, hosts)
    print(
        f"raw TCP, {MB} MB, median of {len(between_members)} in turn: member to member "
        f"{rate(statistics.median(between_members))} ({', '.join(rate(t) for t in between_members)}), host to host "
        f"{rate(statistics.median(between_hosts))} ({', '.join(rate(t) for t in between_hosts)})",
        file=sys.stderr,
    )
    cut_host = hosts[1]

    # Cut rank 1's host off the control plane: its agent stops its member, the control plane calls it lost,
    # and the gang stops on rank 0's host too and is requeued as one.
    cut = ["iptables", "-I", "OUTPUT", "-d", f"10.{cluster.net}.0.1", "-j", "DROP"]
    assert in_host(cluster, cut_host, *cut).returncode == 0
    try:

        def finished():
            state = gang_state(cluster, job_id)
            return state if state["status"] in ("succeeded", "failed") else None

        try:
            done = wait_until(finished, timeout=180, what="the gang to resume and finish")
        except AssertionError:
            history = cluster.sql(
                "SELECT from_status, to_status, reason FROM scheduler_workloadevent WHERE workload_id = %s ORDER BY id",
                (workload,),
            )
            members_now = cluster.sql(
                "SELECT rank, node_name, status, exit_code, reason FROM scheduler_workloadmember "
                "WHERE workload_id = %s ORDER BY rank",
                (workload,),
            )
            raise AssertionError(
                f"the gang did not finish: {history}; members {members_now}; now {gang_state(cluster, job_id)}"
            ) from None
    finally:
        in_host(cluster, cut_host, "iptables", "-D", "OUTPUT", "-d", f"10.{cluster.net}.0.1", "-j", "DROP")
    assert done["status"] == "succeeded", done
    assert done["preemptions"] >= 1
    history = [
        reason
        for (reason,) in cluster.sql(
            "SELECT reason FROM scheduler_workloadevent WHERE workload_id = %s AND to_status = 'queued' ORDER BY id",
            (workload,),
        )
    ]
    assert any("requeued as one" in reason for reason in history), history
    again = done["members"]
    assert {m["node"] for m in again}.isdisjoint({members[1]["node"]}), again  # not on the host cut off
    # The members' containers went when they ended (none stays "Exited (0)"); a rank that had not resumed would
    # still be waiting for its SIGTERM, so both exiting 0 is both resuming. Every member's output is the job's log.
    for member in again:
        engine = cluster.engine(int(member["node"][1:]))
        assert not engine.containers.list(all=True, filters={"label": f"gpucloud.uid={uid}"}), member
    assert [(m["status"], m["exit_code"]) for m in again] == [("exited", 0), ("exited", 0)], again
    response = cluster.api("get", f"jobs/{job_id}/logs/", params={"format": "ndjson"})
    log = "\n".join(json.loads(line).get("line", "") for line in response.text.splitlines())
    assert "resumed from step 1" in log and "allreduce sum=3" in log, log
    assert "finished after resuming from step 1" in done["log_tail"], done["log_tail"]
    # One job on the bill: its meter segments are the workload's, for both cards each time.
    segments = cluster.sql("SELECT count(*) FROM billing_metersegment WHERE workload_id = %s", (workload,))[0][0]
    assert segments == 2
    wait_until(
        lambda: (
            cluster.sql("SELECT status FROM scheduler_node WHERE name = %s", (members[1]["node"],))[0][0] == "active"
        ),
        timeout=90,
        what="the host cut off to rejoin",
    )
    # Rank 1's output of both placements is in the job's log, each line tagged with its rank and host: on the
    # host cut off (read there once it is back) and on the one it resumed on.
    response = cluster.api("get", f"jobs/{job_id}/logs/", params={"format": "ndjson", "rank": "1"})
    assert response.status_code == 200, response.text
    ones = [json.loads(line) for line in response.text.splitlines()][:-1]
    for placement in (members, again):
        host = next(m["node"] for m in placement if m["rank"] == 1)
        said = [line["line"] for line in ones if (line["rank"], line["host"]) == (1, host)]
        assert any(text.startswith("rank 1 of 2 (world 2)") for text in said), (host, ones)
    assert "allreduce sum=3" in [
        line["line"] for line in ones if line["host"] == next(m["node"] for m in again if m["rank"] == 1)
    ], ones
    # The gang ended: no host keeps a way through its fence for it.
    for host in {*hosts, *(int(m["node"][1:]) for m in again)}:
        for table in ("filter", "nat"):
            wait_until(
                lambda h=host, t=table: (
                    "-A" not in in_host(cluster, h, "iptables", "-t", t, "-S", "GPUCLOUD-GANGS").stdout
                ),
                timeout=30,
                what=f"h{host}'s {table} chain of the gangs to empty",
            )
