"""Create an instance through the API (over TCP) until its container runs, against a plain
``docker run`` of the same image on the same host's engine, in the same run: one at a time, then 50
at once.

Brings up its own cluster with config/dev/cluster.sh (needs root): the control plane on the bench's
instance of the address plan (prefix gcb, bridge 10.237.0.1) and ONE GPU host in its own network
namespace with its own Docker engine and node agent, 8 simulated RTX 3090s, the fenced tenants'
network (production's mode) — the agent reaches PostgreSQL and Redis over its veth, as a server on a
LAN. The instance's time is from just before its POST to the ``started_at`` its agent records once
Docker has started the container (both clocks are this machine's). ``docker run -d`` is timed until
it returns (the container has started), on the same engine and network.

    sudo python bench/launch_latency.py [--repeat 5] [--concurrent 50]

Ends with one JSON line: {"create_to_running_s", "docker_run_s", "overhead_s",
"create_to_running_s_at_50", "docker_run_s_at_50", "overhead_s_at_50", ...}; target overhead_s < 0.5.
"""

import argparse
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import _setup

from tests.cluster.harness import IMAGE, Cluster

IDLE = "trap 'exit 0' TERM; while :; do sleep 1; done"  # what an instance runs (INSTANCE_IDLE_COMMAND)
SETTINGS = {
    "THROTTLE_CREATE": "100000/min",
    "THROTTLE_USER": "100000/min",
    "MAX_QUEUED_PER_USER": "1000",
    "CLUSTER_CARDS_1": "sim:8xRTX3090",
    "CLUSTER_NODE_CPUS": "64",
    "CLUSTER_NODE_MEMORY_MB": "131072",
    "LOG_LEVEL": "WARNING",
    "CLUSTER_IMAGES": "gpucloud/busybox-standin:latest",  # all it runs: no PyTorch image to push
}


def docker_run(cluster: Cluster, name: str) -> float:
    """Seconds of ``docker run -d`` on host 1's engine (it returns once the container started).

    The image is the catalog's registry reference, which the host's engine holds once the agent
    has pulled it (the warm-up instance).
    """
    socket = f"unix:///run/gpucloud-{cluster.prefix}/h1.sock"
    image = next(
        i["docker_ref"] for i in cluster.api("get", "images/").json()["results"] if i["docker_ref"].endswith(IMAGE)
    )
    started = time.perf_counter()
    subprocess.run(
        ["docker", "-H", socket, "run", "-d", "--name", name, "--network", "gpucloud-tenants", image, "sh", "-c", IDLE],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - started


def docker_remove(cluster: Cluster, names: list[str]) -> None:
    socket = f"unix:///run/gpucloud-{cluster.prefix}/h1.sock"
    subprocess.run(["docker", "-H", socket, "rm", "-f", *names], check=True, capture_output=True)


def create_to_running(
    cluster: Cluster, gpus: str, errors: list, phases: list, poll_s: float = 0.1
) -> tuple[float | None, int | None]:
    """Seconds from just before the POST to the agent's started_at; and the instance id.

    Appends to ``phases`` where the time went: the API request up to the row's insert, the
    scheduler (created -> placed: the "starting" event), the agent (placed -> started_at).
    Polling only learns that it runs: the time is the agent's own record, whatever ``poll_s`` is.
    """
    started = time.time()
    try:
        instance = cluster.create_instance("RTX3090", gpus=gpus)
        running = cluster.wait_instance(instance["id"], "running", timeout=300, every=poll_s)
    except AssertionError as exc:
        errors.append(str(exc)[:200])
        return None, None
    ((created, placed, running_at),) = cluster.sql(
        "SELECT w.created_at, (SELECT min(e.created_at) FROM scheduler_workloadevent e "
        "WHERE e.workload_id = w.id AND e.to_status = 'starting'), w.started_at "
        "FROM portal_instance i JOIN scheduler_workload w ON w.id = i.workload_id WHERE i.id = %s",
        [instance["id"]],
    )
    phases.append(
        (created.timestamp() - started, (placed - created).total_seconds(), (running_at - placed).total_seconds())
    )
    return datetime.fromisoformat(running["started_at"]).timestamp() - started, instance["id"]


def mean_phases(phases: list) -> dict:
    if not phases:
        return {}
    return {
        name: round(statistics.mean(p[k] for p in phases), 3)
        for k, name in enumerate(("api_s", "scheduler_s", "agent_s"))
    }


def release_all(cluster: Cluster, ids: list[int], errors: list) -> None:
    def release(instance_id):
        try:
            cluster.release(instance_id)
        except AssertionError as exc:
            errors.append(str(exc)[:200])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(release, [i for i in ids if i is not None]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="one-at-a-time launches of each kind")
    parser.add_argument("--concurrent", type=int, default=50)
    parser.add_argument("--agent-concurrency", type=int, default=2, help="launches the node agent runs at once")
    args = _setup.parse(parser, repeat=1, concurrent=4)
    settings = SETTINGS | {"CLUSTER_AGENT_CONCURRENCY": str(args.agent_concurrency)}
    cluster = Cluster(
        prefix=_setup.CLUSTER_PREFIX,
        net=_setup.CLUSTER_NET,
        directory=_setup.ROOT / "var" / "cluster-bench",
        settings=settings,
    )
    errors: list[str] = []
    started = time.monotonic()
    cluster.up(1)
    print(f"cluster up in {time.monotonic() - started:.0f}s", file=sys.stderr)
    try:
        # Warm both paths once (the agent pulls the image from the registry; the web workers, the
        # agent's connections), the agent's first so that plain Docker finds the image pulled.
        _, warm = create_to_running(cluster, "1", errors, [])
        release_all(cluster, [warm], errors)
        docker_run(cluster, "bench-warm")
        docker_remove(cluster, ["bench-warm"])

        singles, plain, phases_one, phases_many = [], [], [], []
        for k in range(args.repeat):
            plain.append(docker_run(cluster, f"bench-one-{k}"))
            docker_remove(cluster, [f"bench-one-{k}"])
            seconds, instance_id = create_to_running(cluster, "1", errors, phases_one)
            if seconds is not None:
                singles.append(seconds)
            release_all(cluster, [instance_id], errors)

        names = [f"bench-many-{k}" for k in range(args.concurrent)]
        with ThreadPoolExecutor(args.concurrent) as pool:
            plain_many = list(pool.map(lambda name: docker_run(cluster, name), names))
        docker_remove(cluster, names)
        with ThreadPoolExecutor(args.concurrent) as pool:
            outcomes = list(
                pool.map(
                    lambda _: create_to_running(cluster, "0.1", errors, phases_many, poll_s=1.0), range(args.concurrent)
                )
            )
        many = [seconds for seconds, _ in outcomes if seconds is not None]
        release_all(cluster, [instance_id for _, instance_id in outcomes], errors)
    finally:
        cluster.down()

    def p(values, q):
        return round(statistics.quantiles(values, n=100)[q - 1], 3) if len(values) > 1 else None

    create_s, docker_s = statistics.median(singles), statistics.median(plain)
    create_50, docker_50 = statistics.mean(many), statistics.mean(plain_many)
    _setup.report(
        {
            "setup": "cluster.sh, 1 host in its own netns + engine, fenced network, API over TCP",
            "create_to_running_s": round(create_s, 3),
            "docker_run_s": round(docker_s, 3),
            "overhead_s": round(create_s - docker_s, 3),
            "create_to_running_s_at_50": round(create_50, 3),
            "create_to_running_p95_s_at_50": p(many, 95),
            "docker_run_s_at_50": round(docker_50, 3),
            "overhead_s_at_50": round(create_50 - docker_50, 3),
            "phases": mean_phases(phases_one),
            "phases_at_50": mean_phases(phases_many),
            "repeat": args.repeat,
            "concurrent": args.concurrent,
            "agent_concurrency": args.agent_concurrency,
            "error_examples": errors[:3],
        },
        errors=len(errors),
    )


if __name__ == "__main__":
    main()
