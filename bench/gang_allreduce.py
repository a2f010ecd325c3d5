"""All-reduce between two members of a gang on two hosts, against raw TCP between those two hosts.

Brings up its own cluster with config/dev/cluster.sh (needs root; prefix gcb, 10.237-10.239; h1 and h3 hold 4
simulated RTX 3090s each) and submits, through the API, a gang job of 2 cards on 2 nodes on the PyTorch CPU image
whose command is what a user types:

    torchrun --nnodes $NNODES --node-rank $NODE_RANK --nproc-per-node $NPROC_PER_NODE \
             --master-addr $MASTER_ADDR --master-port $MASTER_PORT allreduce_worker.py

(bench/gang/allreduce_worker.py, written into the job's folder by its command): gloo all-reduces ``--mb`` MB of
float32 ``--iters`` times (after two warm-ups), then rank 1 sends rank 0 the same bytes over one plain TCP
connection between the members' containers. Once the job ends, the bench sends the same bytes ``--iters`` times
over one TCP connection from one of the two hosts to the other (a Python sender and sink in the hosts' network
namespaces): the raw baseline of the same run.

Bandwidth is bus bandwidth, bytes x 2(n-1)/n per second (n = 2: the tensor's bytes; what each rank sends and
receives in a ring all-reduce), median of the iterations; the spread is min-max.

    sudo python bench/gang_allreduce.py [--mb 64] [--iters 10]

Ends with one JSON line: {"allreduce_mb_s", "raw_host_mb_s", "ratio", "raw_member_mb_s", ...}; target: ratio ≥ 0.5.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

import _setup

from tests.cluster.harness import GANG_TORCHRUN, Cluster, uploaded

WORKER = _setup.ROOT / "bench" / "gang" / "allreduce_worker.py"
IMAGE = "gpucloud/pytorch:2.13.0-cpu"
SETTINGS = {"SCHEDULER_TICK_S": "1", "RECONCILE_S": "1", "NODE_HEARTBEAT_S": "1"}
RAW_PORT = 41300
SINK = """
import socket, sys
mb, iters = int(sys.argv[2]), int(sys.argv[3])
with socket.create_server((sys.argv[1], {port})) as server:
    print("listening", flush=True)
    conn, _ = server.accept()
    with conn:
        for _ in range(iters):
            left = mb * 2**20
            while left:
                left -= len(conn.recv(min(left, 1 << 20)))
            conn.sendall(b"k")
""".replace("{port}", str(RAW_PORT))
SEND = """
import json, socket, sys, time
mb, iters = int(sys.argv[2]), int(sys.argv[3])
payload, times = b"\\0" * (mb * 2**20), []
with socket.create_connection((sys.argv[1], {port})) as conn:
    for _ in range(iters):
        began = time.perf_counter()
        conn.sendall(payload)
        assert conn.recv(1) == b"k"
        times.append(time.perf_counter() - began)
print(json.dumps(times))
""".replace("{port}", str(RAW_PORT))


def gang_job(cluster: Cluster, mb: int, iters: int) -> tuple[dict, dict]:
    """Run the all-reduce job; (its final state, rank 0's RESULT)."""
    command = uploaded(WORKER, f"torchrun {GANG_TORCHRUN} {WORKER.name}")
    body = cluster.work_body("RTX3090", gpus=2, nodes=2, command=command, cpu_cores=2, memory_gb=4)
    body |= {"image": cluster.catalog["images"][IMAGE], "env": {"MB": str(mb), "ITERS": str(iters)}}
    response = cluster.api("post", "jobs/", json=body)
    if response.status_code != 201:
        raise RuntimeError(f"the job was refused: {response.status_code} {response.text}")
    done, records = cluster.job_ended(response.json()["id"], timeout=600)
    lines = [r.get("line", "") for r in records]
    results = [json.loads(text.removeprefix("RESULT ")) for text in lines if text.startswith("RESULT ")]
    if done["status"] != "succeeded" or not results:
        raise RuntimeError(f"the job {done['status']} without a result:\n" + "\n".join(lines))
    return done, results[0]


def raw_between_hosts(cluster: Cluster, hosts: list[int], mb: int, iters: int) -> list[float]:
    """Seconds for ``mb`` MB from host hosts[1] to host hosts[0] over one TCP connection, ``iters`` times."""
    address = cluster.host_address(hosts[0])
    args = [address, str(mb), str(iters)]
    sink = subprocess.Popen(
        ["nsenter", f"--net={cluster.host_netns(hosts[0])}", sys.executable, "-c", SINK, *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sink.stdout.readline().strip() == "listening"
        sent = subprocess.run(
            ["nsenter", f"--net={cluster.host_netns(hosts[1])}", sys.executable, "-c", SEND, *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        return json.loads(sent.stdout)
    finally:
        sink.kill()
        sink.wait(10)


def rates(mb: int, seconds: list[float]) -> dict:
    each = [mb / s for s in seconds]
    return {"median": round(statistics.median(each)), "min": round(min(each)), "max": round(max(each))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64, help="MB of float32 all-reduced each time")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    args = _setup.parse(parser, mb=16, iters=3)
    cluster = Cluster(
        prefix=_setup.CLUSTER_PREFIX,
        net=_setup.CLUSTER_NET,
        directory=_setup.ROOT / "var" / "cluster-bench",
        settings=SETTINGS,
    )
    started = time.monotonic()
    cluster.up(3)
    up_s = time.monotonic() - started
    try:
        done, result = gang_job(cluster, args.mb, args.iters)
        hosts = [int(m["node"][1:]) for m in done["members"]]
        host_s = raw_between_hosts(cluster, hosts, args.mb, args.iters)
    finally:
        if not args.keep:
            cluster.down()
    world = result["world"]
    bus = args.mb * 2 * (world - 1) / world  # MB each rank sends (and receives) per all-reduce
    allreduce = rates(bus, result["allreduce_s"])
    host = rates(args.mb, host_s)
    _setup.report(
        {
            "setup": "cluster.sh: gang of 2 members (torchrun, gloo, 1 process each) on h1 and h3, PyTorch 2.13 CPU",
            "world": world,
            "mb": args.mb,
            "iters": args.iters,
            "allreduce_mb_s": allreduce["median"],
            "allreduce_spread": [allreduce["min"], allreduce["max"]],
            "raw_host_mb_s": host["median"],
            "raw_host_spread": [host["min"], host["max"]],
            "ratio": round(allreduce["median"] / host["median"], 3),
            "raw_member_mb_s": rates(args.mb, result["raw_s"])["median"],
            "cluster_up_s": round(up_s),
            "seconds": round(time.monotonic() - started),
        },
        errors=0,
    )


if __name__ == "__main__":
    main()
