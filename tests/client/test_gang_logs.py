"""A gang's every member's output is the job's log, each line tagged with its rank and host: collected on its own
host (real containers; two simulated hosts on one engine, each with its agent's collector and relay), read
through the API (``rank`` for one member's), the real CLI (``gpucloud logs --rank N``) and the job page (each
member's last lines)."""

import json
import threading

import pytest
from django.db import connection

from agent import collector as log_collector
from agent import gangs, launcher
from agent.actions import agent_launch
from agent.reconcile import agent_reconcile
from agent.relay.server import RelayServer
from portal.models import Job
from portal.services.logs import Query, log_lines
from scheduler.models import WorkloadRun, WorkloadStatus
from scheduler.services.allocation import Part, Placement, Share, allocations_create
from scheduler.services.gangs import gang_step
from tests.conftest import make_node, remove_node_containers, wait_for
from tests.scheduler.factories import workload

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]
# Each rank prints its steps; rank 1 also to stderr. Both end well, the gang succeeds.
SCRIPT = 'for i in 1 2 3; do echo "rank $NODE_RANK step $i"; done; [ "$NODE_RANK" = 0 ] || echo "rank 1 warns" >&2'


@pytest.fixture
def hosts(monkeypatch, settings, tmp_path):
    """Two hosts, each with its agent's log collector and relay. They share one engine and, here, one log folder
    (a host has its own): one host's scan would take the other's running member for a container gone, so the
    scans wait (the collectors follow containers from Docker's start events) and a removal settles the output on
    whichever collector follows it."""
    settings.WORKLOG_DIR = tmp_path / "worklogs"
    settings.INSTANCE_STOP_GRACE_S = settings.PREEMPTION_GRACE_S = 2
    monkeypatch.setattr(gangs, "old_members_remove", lambda workload, keep: None)  # the other host's, on one engine
    monkeypatch.setattr(log_collector, "SCAN_S", 3600)
    a, b = make_node("sim:1xRTX3090"), make_node("sim:1xRTX3090")
    collectors, relays = [], []
    for node in (a, b):
        collectors.append(log_collector.Collector(node.name, launcher.docker_client().api).start())
        relay = RelayServer(node.name, api=launcher.docker_client().api, host="127.0.0.1", port=0)
        node.relay_url, node.relay_tls_sha256 = relay.start(), relay.tls_sha256
        node.save(update_fields=["relay_url", "relay_tls_sha256"])
        relays.append(relay)

    def settle(name, timeout=log_collector.SETTLE_S):
        for each in collectors:
            each.settle(name, timeout)

    monkeypatch.setattr(log_collector, "settle", settle)
    yield a, b
    for each in (*collectors, *relays):
        each.stop()
    for node in (a, b):
        remove_node_containers(node.name)


def launched_gang(user, catalog, a, b, script: str = SCRIPT):
    """The gang's job, launched on both hosts, and what moves it on (the hosts' reconciles, the gang's step)."""
    work = workload(
        user, kind="job", gpu_count=2, image_ref=catalog["image"].docker_ref, cpu=1, memory_mb=256,
        command=["sh", "-c", script],
    )  # fmt: skip
    job = Job.objects.create(
        owner=user, name="gang", image=catalog["image"], gpu_type=catalog["rtx3090"], gpus=2, command=script,
        cpu_cores=1, memory_gb=1, workload=work,
    )  # fmt: skip
    card, other = a.gpus.get(), b.gpus.get()
    rest = (Part(b.pk, [Share(other.pk, 1000, other.memory_mb)]),)
    assert allocations_create([Placement(work, a.pk, [Share(card.pk, 1000, card.memory_mb)], rest=rest)])
    for node in (a, b):
        agent_launch(work.pk, node.name)

    def step():
        for node in (a, b):
            agent_reconcile(node.name)  # members that ended are reported, their containers removed
        gang_step(work.pk)

    return job, step


def finished_gang(user, catalog, a, b) -> Job:
    job, step = launched_gang(user, catalog, a, b)
    work = job.workload
    done = lambda: work.refresh_from_db() or work.status == WorkloadStatus.SUCCEEDED  # noqa: E731
    wait_for(done, timeout=60, what="the gang succeeded", poke=step)
    gone = lambda: not launcher.containers_of(work.uid)  # noqa: E731
    wait_for(gone, timeout=30, what="its members' containers removed", poke=step)
    return job


def read(api, job, **query) -> list[dict]:
    response = api.get(f"/api/v1/jobs/{job.pk}/logs/", query)
    assert response.status_code == 200, response.content
    return [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]


def test_every_members_output_is_in_the_jobs_log_tagged_with_its_rank_and_host(
    api, user, client, catalog, base_image, hosts, cli
):
    a, b = hosts
    job = finished_gang(user, catalog, a, b)
    runs = list(WorkloadRun.objects.filter(workload=job.workload).values_list("number", "rank", "node_name"))
    assert runs == [(1, 0, a.name), (2, 1, b.name)]  # each member's run, on its own host, rank 0's first

    *lines, end = read(api, job)
    said = [(line["rank"], line["host"], line["stream"], line["line"]) for line in lines]
    assert said[:4] == [
        (0, a.name, "stdout", "rank 0 step 1"), (0, a.name, "stdout", "rank 0 step 2"),
        (0, a.name, "stdout", "rank 0 step 3"),
        (1, b.name, "system", f"— rank 1 on host {b.name} —"),
    ]  # fmt: skip
    # Rank 1's stdout in order; its stderr line anywhere among them (two pipes: Docker keeps no order between them).
    assert [line for line in said[4:-1] if line[2] == "stdout"] == [
        (1, b.name, "stdout", f"rank 1 step {i}") for i in (1, 2, 3)
    ]
    assert [line for line in said[4:-1] if line[2] != "stdout"] == [(1, b.name, "stderr", "rank 1 warns")]
    assert said[-1] == (1, b.name, "system", lines[-1]["line"])
    assert lines[-1]["line"].startswith("— succeeded")
    assert list(lines[0])[:4] == ["n", "t", "stream", "line"]  # the fields before stay first: old readers read on
    cursors = [line["n"] for line in lines]
    assert cursors == sorted(cursors) and len(set(cursors)) == len(cursors)
    assert end["end"]["finished"] and end["end"]["status"] == "succeeded"

    ones = read(api, job, rank=1)[:-1]
    assert [line["line"] for line in ones] == [line[3] for line in said if line[0] == 1]
    zeros = [line["line"] for line in read(api, job, rank=0)[:-1]]
    assert zeros == ["rank 0 step 1", "rank 0 step 2", "rank 0 step 3", lines[-1]["line"]]  # and how the job ended
    assert [line["line"] for line in read(api, job, rank=1, tail=2)[:-1]] == [ones[-2]["line"], lines[-1]["line"]]
    text = api.get(f"/api/v1/jobs/{job.pk}/logs/", {"format": "text", "rank": "1"})
    assert f"[rank 1 on {b.name}] rank 1 step 1" in b"".join(text.streaming_content).decode().splitlines()
    for bad in ("one", "-1", "10000"):
        response = api.get(f"/api/v1/jobs/{job.pk}/logs/", {"rank": bad})
        assert response.status_code == 400 and "rank" in json.loads(response.content)

    result = cli("logs", f"j{job.pk}", "--rank", "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"[rank 1 on {b.name}] rank 1 step {i}" for i in (1, 2, 3)]
    assert f"[rank 1 on {b.name}] rank 1 warns" in result.stderr
    shown = cli("logs", f"j{job.pk}", "--json", "--rank", "0")
    assert [json.loads(line).get("rank") for line in shown.stdout.splitlines()[:-1]] == [0, 0, 0, 0]

    client.force_login(user)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f"Rank 1 on {b.name}: its last lines" in page and f"Rank 0 on {a.name}: its last lines" in page
    member_one = page.split(f"Rank 1 on {b.name}: its last lines")[1].split("</pre>")[0]
    assert "rank 1 step 3\n" in member_one and "rank 1 warns\n" in member_one and "rank 0 step" not in member_one


def test_a_followed_gang_log_gives_rank_0s_lines_then_each_members_to_its_end(user, catalog, base_image, hosts):
    """Followed (as the log socket does): rank 0's piece as it is written, then rank 1's, still running after rank
    0 ended, followed to its end; then the end."""
    a, b = hosts
    script = 'echo "rank $NODE_RANK up"; [ "$NODE_RANK" = 0 ] || { sleep 2; echo "rank 1 late"; }'
    job, step = launched_gang(user, catalog, a, b, script)
    stop = threading.Event()

    def poke():
        while not stop.wait(0.5):
            step()
        connection.close()

    poker = threading.Thread(target=poke, daemon=True)
    poker.start()
    try:
        *lines, end = [json.loads(line) for line in log_lines(job.workload, query=Query(follow=True))]
    finally:
        stop.set()
        poker.join(10)
    said = [(line["rank"], line["host"], line["line"]) for line in lines]
    assert said[:-1] == [
        (0, a.name, "rank 0 up"), (1, b.name, f"— rank 1 on host {b.name} —"),
        (1, b.name, "rank 1 up"), (1, b.name, "rank 1 late"),
    ]  # fmt: skip
    assert said[-1][2].startswith("— succeeded") and end["end"]["finished"]
