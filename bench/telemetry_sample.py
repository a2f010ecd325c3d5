"""What one GPU sample costs the node agent: a simulated 8-card node with N real running containers.

Each sample reads the running work from PostgreSQL, every container's cgroup
CPU and memory, computes the simulated readings, appends the documents to the
Redis history and publishes them to the channel layer — what
``agent/telemetry/sampler.py`` does every second.

    python bench/telemetry_sample.py [--containers 16] [--samples 100]

Uses its own PostgreSQL database (gpucloud_bench_telemetry, recreated) and Redis
database 14; starts and removes its busybox containers. Ends with
{"containers", "sample_ms_p50", "sample_ms_p99", "node_document_bytes", "workload_document_bytes"}.
"""

import argparse
import json
import os
import statistics
import time

import _setup

DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpucloud_bench_telemetry")


def setup() -> None:
    _setup.fresh_database(DATABASE_URL)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=16)
    parser.add_argument("--samples", type=int, default=100)
    args = _setup.parse(parser, containers=2, samples=5)
    setup()
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from agent.gpus import simulated_inventory
    from agent.images import stand_in_ensure
    from agent.launcher import LABEL, docker_client
    from agent.telemetry.sampler import Sampler
    from agent.telemetry.simgpu import SimulatedBackend
    from portal.services.demo import STANDIN_IMAGE
    from scheduler.models import Workload, WorkloadStatus
    from scheduler.services.allocation import Share, allocation_create
    from scheduler.services.nodes import node_register

    stand_in_ensure()
    node = node_register(
        name="bench-telemetry",
        hostname="bench",
        cpu_cores=64,
        memory_mb=1 << 18,
        gpus=simulated_inventory("sim:8xA100-80GB", "bench-telemetry"),
        simulated=True,
        nvidia_runtime=False,
    )
    cards = list(node.gpus.order_by("index"))
    owner = get_user_model().objects.create_user("bench")
    client = docker_client()
    containers = []
    try:
        for i in range(args.containers):
            container = client.containers.run(
                STANDIN_IMAGE,
                ["sh", "-c", "while :; do :; done" if i % 4 == 0 else "sleep 3600"],
                detach=True,
                network_mode="none",
                labels={f"{LABEL}.bench": "telemetry"},
            )
            containers.append(container)
            card = cards[i % len(cards)]
            w = Workload.objects.create(
                owner=owner,
                kind="instance",
                name=f"w{i}",
                image_ref=STANDIN_IMAGE,
                gpu_model=card.model,
                gpu_count=1,
                gpu_milli=250,
                cpu_cores=1,
                memory_mb=1024,
                disk_gb=10,
            )
            allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 250, card.memory_mb // 4)])
            Workload.objects.filter(pk=w.pk).update(
                status=WorkloadStatus.RUNNING, started_at=timezone.now(), container_id=container.id
            )
        sampler = Sampler(node, backend=SimulatedBackend(), docker_client=client)
        sampler.sample_once()  # locates every container's cgroup once
        times = []
        for _ in range(args.samples):
            start = time.perf_counter()
            doc = sampler.sample_once()
            times.append(time.perf_counter() - start)
        from scheduler.telemetry import streams

        [workload_doc] = streams.history_read(streams.workload_stream(node.name, w.pk), count=1)
        times.sort()
        _setup.report(
            {
                "containers": args.containers,
                "sample_ms_p50": round(statistics.median(times) * 1000, 2),
                "sample_ms_p99": round(times[int(len(times) * 0.99) - 1] * 1000, 2),
                "node_document_bytes": len(json.dumps(doc, separators=(",", ":"))),
                "workload_document_bytes": len(workload_doc),
            },
            errors=0,
        )
        sampler.close()
    finally:
        for container in containers:
            container.remove(force=True)


if __name__ == "__main__":
    main()
