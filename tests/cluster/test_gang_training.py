"""Distributed training for real across two hosts: the seed's Lightning DDP template (examples/lightning/train.py,
unchanged; only ``ACCELERATOR=cpu`` set, as on any host without cards) as a gang of two hosts x two processes on
the PyTorch CPU image, with gloo. Lightning's own launcher starts one process per card (``devices`` is the
platform's NPROC_PER_NODE, ``num_nodes`` its NNODES) and forms the process group through MASTER_ADDR:MASTER_PORT;
gloo then connects every pair of ranks on ports of their own at their containers' addresses (eth0, named by
GLOO_SOCKET_IFNAME). It must form a world of 4, its loss must fall, and last.ckpt must land under AUTO_TMPDIR.

It shares the session's cluster with the other several-host tests (no bring-up of its own), with a plain
``torchrun --nnodes 2`` all-reduce beside it (bench/gang_allreduce.py's job at a small size). What the module adds
to a run, on the 2-core development machine (4 Dec 2026): the image's pull on h1 and h3, 21 s; the Lightning gang,
37 s (world 4, losses 13.66, 8.27, 1.85, 0.30); the all-reduce, 42 s (16 MB at 620 MB/s, raw TCP between the same
members 934 MB/s): about 100 s.
"""

import itertools
import json
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.cluster.harness import GANG_TORCHRUN, ROOT, uploaded

pytestmark = pytest.mark.cluster

PYTORCH = "gpucloud/pytorch:2.13.0-cpu"
TEMPLATE = ROOT / "examples" / "lightning" / "train.py"
WORKER = ROOT / "bench" / "gang" / "allreduce_worker.py"
TORCHRUN = GANG_TORCHRUN


def pulled(cluster, ref: str, hosts) -> None:
    """Pull ``ref`` (a registry's) into each of ``hosts``' engines at once, as their agents would at a launch.

    A launch pulls its image within the start's deadline, which the tests' timings make 20 s (360 s by default):
    too short for this 1.15 GB image, so the hosts the gang may land on (the RTX 3090 hosts) have it first."""
    secrets = dict(line.split("=", 1) for line in (cluster.directory / "secrets.env").read_text().splitlines())
    auth = {"username": "gpucloud", "password": secrets["REGISTRY_PASSWORD"]}  # cluster.sh's registry user
    with ThreadPoolExecutor(len(hosts)) as pool:
        list(pool.map(lambda host: cluster.engine(host).images.pull(ref, auth_config=auth), hosts))


@pytest.fixture(scope="module")
def pytorch(cluster) -> int:
    """The PyTorch image's id in the catalog, pulled on the RTX 3090 hosts (h1, h3)."""
    image = next(i for i in cluster.api("get", "images/").json()["results"] if i["docker_ref"].endswith(PYTORCH))
    began = time.monotonic()
    pulled(cluster, image["docker_ref"], hosts=(1, 3))
    print(f"{PYTORCH} pulled on h1 and h3 in {time.monotonic() - began:.0f} s")
    return image["id"]


def shown(records: list[dict]) -> str:
    return "\n".join(f"[{r.get('rank')}@{r.get('host')}] {r.get('line', '')}" for r in records)


@pytest.mark.timeout(420)
def test_the_lightning_ddp_template_trains_as_a_gang_of_two_hosts_by_two_processes_with_gloo(cluster, pytorch):
    # What a user types: python train.py (Lightning launches the processes), rank 0 shows the checkpoint.
    command = uploaded(TEMPLATE, 'python train.py && if [ "$NODE_RANK" = 0 ]; then ls "$AUTO_TMPDIR"; fi')
    body = cluster.work_body(
        "RTX3090",
        gpus=4,
        nodes=2,
        command=command,
        image=pytorch,
        cpu_cores=2,
        memory_gb=4,
        env={"ACCELERATOR": "cpu", "MAX_EPOCHS": "4", "SAMPLES": "512", "BATCH_SIZE": "32"},
    )
    started = time.monotonic()
    response = cluster.api("post", "jobs/", json=body)
    assert response.status_code == 201, response.text
    done, records = cluster.job_ended(response.json()["id"], timeout=360)
    log = shown(records)
    print(f"Lightning gang ended {done['status']} in {time.monotonic() - started:.0f} s:\n{log}")
    assert done["status"] == "succeeded", log
    members = done["members"]
    assert len(members) == 2 and members[0]["node"] != members[1]["node"], members
    said = [r.get("line", "") for r in records if r.get("rank") == 0]
    assert "start: fresh, world_size 4, accelerator cpu" in said, log
    losses = [float(m.group(1)) for text in said if (m := re.match(r"epoch \d+ global_step \d+ loss (\S+)", text))]
    assert len(losses) == 4 and all(b < a for a, b in itertools.pairwise(losses)), losses
    tmpdir = done["auto_tmpdir"]
    assert f"done: global_step {4 * 512 // 32 // 4}, checkpoint {tmpdir}/last.ckpt" in said, log
    assert "last.ckpt" in said, log  # rank 0's ls of AUTO_TMPDIR after the run


@pytest.mark.timeout(300)
def test_a_plain_torchrun_all_reduce_runs_between_two_members_on_two_hosts(cluster, pytorch):
    """bench/gang_allreduce.py's job at a small size: torchrun --nnodes 2, gloo, all-reduces that sum right
    (the worker checks), and the members' raw TCP; the figures are printed, never judged (the bench's)."""
    command = uploaded(WORKER, f"torchrun {TORCHRUN} {WORKER.name}")
    body = cluster.work_body("RTX3090", gpus=2, nodes=2, command=command, image=pytorch, cpu_cores=2, memory_gb=4)
    response = cluster.api("post", "jobs/", json=body | {"env": {"MB": "16", "ITERS": "3"}})
    assert response.status_code == 201, response.text
    started = time.monotonic()
    done, records = cluster.job_ended(response.json()["id"], timeout=240)
    log = shown(records)
    assert done["status"] == "succeeded", log
    result = next(
        json.loads(r["line"].removeprefix("RESULT ")) for r in records if r.get("line", "").startswith("RESULT ")
    )
    assert result["world"] == 2 and len(result["allreduce_s"]) == len(result["raw_s"]) == 3, result
    rate = [round(16 / statistics.median(result[k])) for k in ("allreduce_s", "raw_s")]
    print(
        f"torchrun all-reduce job {time.monotonic() - started:.0f} s: 16 MB all-reduced at {rate[0]} MB/s, "
        f"raw {rate[1]} MB/s"
    )
