"""A job over two hosts (a gang), for real: its members find each other through MASTER_ADDR:MASTER_PORT across
hosts and all-reduce; one member's host is cut off; the gang is requeued as one and resumes from its checkpoint
on the shared storage, on other hosts.

The images here have no PyTorch (and no Python: they are busybox stand-ins), so the all-reduce is a small TCP
one in sh with busybox's nc that reads exactly the contract torchrun reads: NODE_RANK, NNODES, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, plus the hostfile and AUTO_TMPDIR. Rank 0 gathers every member's value on
MASTER_PORT, sums, and sends the sum back to each (a star all-reduce, what a TCP store does).
"""

import pytest

from tests.cluster.harness import wait_until
from tests.cluster.test_hosts_together import in_host

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


def member_logs(cluster, uid: str, member: dict) -> str:
    name = f"gpucloud-job-{uid}" + (f"-r{member['rank']}" if member["rank"] else "")
    return cluster.engine(int(member["node"][1:])).containers.get(name).logs().decode(errors="replace")


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
    rank1_log = member_logs(cluster, uid, members[1])
    master = cluster.host_address(int(members[0]["node"][1:]))
    assert f"rank 1 of 2 (world 2) at {master}:" in rank1_log, rank1_log
    assert f"{master} slots=1\n{cluster.host_address(int(members[1]['node'][1:]))} slots=1" in rank1_log

    # The way through the fence is rank 1's container to rank 0's host and port, and nothing else.
    port = cluster.sql("SELECT master_port FROM scheduler_workload WHERE id = %s", (workload,))[0][0]
    cut_host = int(members[1]["node"][1:])
    address = cluster.engine(cut_host).containers.get(f"gpucloud-job-{uid}-r1").attrs["NetworkSettings"]
    address = address["Networks"]["gpucloud-tenants"]["IPAddress"]
    way = [r for r in in_host(cluster, cut_host, "iptables", "-S", "GPUCLOUD-GANGS").stdout.splitlines() if "-A" in r]
    assert len(way) == 1 and f"-s {address}/32 -d {master}/32" in way[0] and f"--dport {port}" in way[0], way
    assert "-j ACCEPT" in way[0]
    rank0_host = int(members[0]["node"][1:])
    assert "-A" not in in_host(cluster, rank0_host, "iptables", "-S", "GPUCLOUD-GANGS").stdout

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
    for member in again:
        log = member_logs(cluster, uid, member)
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
