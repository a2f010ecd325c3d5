"""Logs of jobs and instances: collected on the host by the agent's collector from real containers, read
through the node's relay by the API and the follow socket (daphne, no Docker in the web tier)."""

import asyncio
import json
import os

import pytest
import websockets
import websockets.exceptions  # the package does not import it itself until a connection does
from django.db import connection

from agent import collector as log_collector
from agent import worklogs
from agent.launcher import docker_client
from portal.models import Instance
from scheduler.models import NodeStatus, Workload, WorkloadRun
from tests.conftest import wait_for, wait_status
from tests.portal.test_instance_api import create
from tests.portal.test_jobs_and_preemption import TRAINER, reconcile, submit_job
from tests.portal.test_live_updates import session_cookie

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


@pytest.fixture
def logs_node(node_worker, settings, tmp_path):
    """The node's worker and relay, and its agent's log collector writing under a fresh WORKLOG_DIR."""
    settings.WORKLOG_DIR = tmp_path / "worklogs"
    collector = log_collector.Collector(node_worker.name, docker_client().api).start()
    yield node_worker
    collector.stop()


def read(api, job, **query) -> list[dict]:
    response = api.get(f"/api/v1/jobs/{job.pk}/logs/", query)
    assert response.status_code == 200, response.content
    return [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]


def texts(lines) -> list[str]:
    return [line["line"] for line in lines if line.get("stream") in ("stdout", "stderr")]


def test_a_failed_jobs_log_outlives_its_container_and_ends_with_its_last_lines_and_reason(api, catalog, logs_node):
    job = submit_job(
        api, catalog, command='for i in $(seq 1 40); do echo "step $i"; done; sleep 0.3; echo oops >&2; exit 3'
    )
    wait_status(job.workload, "failed", poke=reconcile(logs_node))
    assert not docker_client().containers.list(all=True, filters={"name": job.workload.container_name})

    lines = read(api, job)
    *body, end = lines
    assert texts(body) == [f"step {i}" for i in range(1, 41)] + ["oops"]
    assert [line["stream"] for line in body[-2:]] == ["stderr", "system"]
    assert "code 3" in body[-1]["line"] and body[-1]["line"].startswith("— failed")
    assert end["end"] == {
        "status": "failed",
        "exit_code": 3,
        "reason": job.workload.status_reason,
        "cursor": body[-1]["n"],
        "finished": True,
    }
    cursors = [line["n"] for line in body]
    assert cursors == sorted(cursors) and len(set(cursors)) == len(cursors)

    last = read(api, job, tail=3)
    assert [line.get("line") for line in last[:-1]] == ["step 40", "oops", body[-1]["line"]]
    text = api.get(f"/api/v1/jobs/{job.pk}/logs/", {"format": "text", "download": "1"})
    assert text["Content-Disposition"] == f'attachment; filename="job-{job.pk}.log"'
    assert b"".join(text.streaming_content).decode().splitlines()[-3:-1] == ["step 40", "oops"]


def test_tail_since_and_after_select_the_lines_with_no_docker_in_the_web_tier(api, catalog, logs_node, monkeypatch):
    from agent import launcher

    job = submit_job(api, catalog, command="for i in $(seq 1 30); do echo line $i; done")
    wait_status(job.workload, "succeeded", poke=reconcile(logs_node))

    def no_docker():
        raise AssertionError("the web tier called Docker")

    monkeypatch.setattr(launcher, "docker_client", no_docker)  # the relay and collector hold their own client
    everything = read(api, job)[:-1]
    assert texts(everything) == [f"line {i}" for i in range(1, 31)]

    after = read(api, job, after=everything[9]["n"])
    assert after[:-1] == everything[10:]
    assert after[-1]["end"]["cursor"] == everything[-1]["n"]
    nothing = read(api, job, after=everything[-1]["n"])
    assert nothing == [{"end": nothing[0]["end"] | {"cursor": everything[-1]["n"]}}]
    assert texts(read(api, job, tail=5)) == [f"line {i}" for i in range(27, 31)]  # and the final system line
    since = everything[20]["t"]
    assert texts(read(api, job, since=since)) == texts(line for line in everything if line["t"] >= since)
    assert "line 21" in texts(read(api, job, since=since))
    assert texts(read(api, job, since="1h")) == texts(everything)
    assert read(api, job, since="2999-01-01T00:00:00Z")[:-1] == []

    for bad in ({"tail": "-1"}, {"after": "12"}, {"since": "yesterday"}, {"tail": "0", "format": "text"}):
        response = api.get(f"/api/v1/jobs/{job.pk}/logs/", bad)
        assert response.status_code == 400 and list(bad)[0] in json.loads(response.content)
        assert response["Content-Type"] == "application/json"  # the API's usual error, in either format


def test_an_outsider_and_strangers_get_404(api, outsider_api, catalog, logs_node, client):
    job = submit_job(api, catalog, command="echo secret")
    wait_status(job.workload, "succeeded", poke=reconcile(logs_node))
    assert outsider_api.get(f"/api/v1/jobs/{job.pk}/logs/").status_code == 404
    assert client.get(f"/api/v1/jobs/{job.pk}/logs/").status_code in (401, 403)


def test_a_preempted_and_resumed_job_shows_one_log_with_markers(api, catalog, logs_node, settings, may_submit_high):
    settings.PREEMPTION_GRACE_S = 5
    long = submit_job(api, catalog, gpus="2", command=TRAINER)
    wait_status(long.workload, "running")
    Workload.objects.filter(pk=long.workload.pk).update(attained_service=1e9)
    short = submit_job(api, catalog, command="sleep 1; echo short done", priority="high")
    wait_status(long.workload, "queued", timeout=40)
    wait_status(short.workload, "succeeded", timeout=40, poke=reconcile(logs_node))
    wait_status(long.workload, "succeeded", timeout=60, poke=reconcile(logs_node))

    *lines, end = read(api, long)
    said = [line["line"] for line in lines]
    assert WorkloadRun.objects.filter(workload=long.workload).count() == 2
    assert said[0].startswith("start at 0, resume 0")
    checkpointed = next(i for i, text in enumerate(said) if text.startswith("checkpointed at"))
    assert lines[checkpointed + 1]["stream"] == "system" and "preempted" in said[checkpointed + 1]
    assert said[checkpointed + 2] == f"— resumed on host {logs_node.name} —"
    assert said[checkpointed + 3].startswith("start at ") and "resume 1" in said[checkpointed + 3]
    assert said[-2] == "done at 25" and said[-1].startswith("— succeeded")
    cursors = [line["n"] for line in lines]
    assert cursors == sorted(cursors) and len(set(cursors)) == len(cursors)
    assert end["end"]["status"] == "succeeded" and end["end"]["finished"]


def test_a_piece_on_a_lost_host_is_shown_as_unavailable(api, catalog, logs_node):
    job = submit_job(api, catalog, command="echo from the lost host")
    wait_status(job.workload, "succeeded", poke=reconcile(logs_node))
    type(logs_node).objects.filter(pk=logs_node.pk).update(status=NodeStatus.LOST)
    *lines, end = read(api, job)
    assert lines[0]["stream"] == "system" and "unavailable (the host is lost)" in lines[0]["line"]
    assert end["end"]["finished"]


def test_output_over_the_cap_and_the_rate_is_dropped_with_markers(api, catalog, logs_node, settings):
    settings.WORKLOG_MAX_MB = 1
    settings.WORKLOG_RATE_KB_S = 512
    settings.WORKLOG_BURST_MB = 1
    line = "x" * 1000
    # 4 MB at about 1 MB/s: slow enough for Docker's own log to hand every line over (a faster flood
    # loses lines inside Docker, which bench/log_flood.py measures), fast enough for the 512 KB/s rate.
    burst = f"for i in $(seq 1 100); do echo {line}$j.$i; done"
    command = f"for j in $(seq 1 40); do {burst}; sleep 0.1; done; echo last line"
    job = submit_job(api, catalog, command=command)
    wait_status(job.workload, "succeeded", timeout=90, poke=reconcile(logs_node))

    folder = worklogs.workload_dir(job.workload.pk)
    stored = sum(os.path.getsize(folder / name) for name in os.listdir(folder) if name.endswith(".ndjson"))
    assert stored <= 1024 * 1024 + 160 * 1024  # the cap, and at most the segment being written
    *lines, _ = read(api, job)
    system = [line["line"] for line in lines if line["stream"] == "system"]
    assert any("bytes of older output dropped" in text for text in system)
    assert any("bytes dropped (output faster than 512 KB/s)" in text for text in system)
    assert lines[0]["stream"] == "system"  # the log starts by saying what went
    assert texts(lines)[-1] == "last line"
    state = worklogs.state_read(job.workload.pk, 1)
    assert state.dropped_bytes > 0 and state.head_dropped_bytes > 0


def test_a_restarted_collector_resumes_without_losing_or_repeating_a_line(
    api, catalog, node_worker, settings, tmp_path
):
    settings.WORKLOG_DIR = tmp_path / "worklogs"
    first = log_collector.Collector(node_worker.name, docker_client().api).start()
    job = submit_job(
        api, catalog, command="for i in $(seq 1 3000); do echo n$i; [ $((i % 500)) = 0 ] && sleep 0.5; done; exit 0"
    )
    wait_for(lambda: (s := worklogs.state_read(job.workload.pk, 1)) and s.seq > 600, what="some lines stored")
    first.stop()  # the agent goes away mid-stream
    again = log_collector.Collector(node_worker.name, docker_client().api).start()
    try:
        wait_status(job.workload, "succeeded", timeout=60, poke=reconcile(node_worker))
        assert texts(read(api, job)) == [f"n{i}" for i in range(1, 3001)]
    finally:
        again.stop()


# -- the follow socket ---------------------------------------------------------------------------------


def follow_url(server: str, job, **query) -> str:
    suffix = "&".join(f"{k}={v}" for k, v in query.items())
    return f"ws://{server}/ws/logs/jobs/{job.pk}/" + (f"?{suffix}" if suffix else "")


async def frames_until_closed(ws, timeout: float = 30) -> tuple[list[dict], int]:
    frames = []
    try:
        while True:
            frames.append(json.loads(await asyncio.wait_for(ws.recv(), timeout)))
    except websockets.exceptions.ConnectionClosed as closed:
        return frames, closed.rcvd.code


def touch_go(job) -> None:
    docker_client().containers.get(job.workload.container_name).exec_run(["touch", "/tmp/go"])


WAITER = "echo first; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo second; exit 4"


def test_follow_sees_lines_as_they_are_printed_then_the_end_frame(api, catalog, logs_node, web_server, user):
    job = submit_job(api, catalog, command=WAITER)
    wait_status(job.workload, "running")
    headers = {"Origin": "http://127.0.0.1", "Cookie": session_cookie(user)}

    async def follow():
        async with websockets.connect(follow_url(web_server, job), additional_headers=headers) as ws:
            first = json.loads(await asyncio.wait_for(ws.recv(), 30))
            await asyncio.to_thread(job.workload.refresh_from_db)
            still = job.workload.status
            await asyncio.to_thread(touch_go, job)
            rest, code = await frames_until_closed(ws, timeout=60)
        return first, still, rest, code

    def poke_in_background():
        return asyncio.to_thread(wait_status, job.workload, "failed", 60, reconcile(logs_node))

    async def both():
        return await asyncio.gather(follow(), poke_in_background())

    (first, still, rest, code), _ = asyncio.run(both())
    connection.close()
    assert first["line"] == "first" and still == "running"  # seen while the job still ran
    assert [f.get("line") for f in rest[:-2]] == ["second"]
    assert rest[-2]["stream"] == "system" and "code 4" in rest[-2]["line"]
    assert rest[-1]["end"]["status"] == "failed" and rest[-1]["end"]["exit_code"] == 4
    assert rest[-1]["end"]["cursor"] == rest[-2]["n"] and code == 1000


def test_a_follower_that_reconnects_with_after_gets_every_line_once(api, catalog, logs_node, web_server, user):
    job = submit_job(api, catalog, command="for i in $(seq 1 200); do echo n$i; done; " + WAITER)
    wait_status(job.workload, "running")
    headers = {"Origin": "http://127.0.0.1", "Cookie": session_cookie(user)}

    async def session():
        async with websockets.connect(follow_url(web_server, job), additional_headers=headers) as ws:
            got = [json.loads(await asyncio.wait_for(ws.recv(), 30)) for _ in range(120)]
        async with websockets.connect(
            follow_url(web_server, job, after=got[-1]["n"]), additional_headers=headers
        ) as ws:
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
                got.append(frame)
                if frame.get("line") == "first":
                    break
            await asyncio.to_thread(touch_go, job)
            rest, code = await frames_until_closed(ws, timeout=60)
        return got + rest, code

    async def both():
        poke = asyncio.to_thread(wait_status, job.workload, "failed", 60, reconcile(logs_node))
        return await asyncio.gather(session(), poke)

    (frames, code), _ = asyncio.run(both())
    connection.close()
    lines = [f for f in frames if "n" in f]
    assert [f["line"] for f in lines if f["stream"] == "stdout"] == [f"n{i}" for i in range(1, 201)] + [
        "first",
        "second",
    ]
    assert len({f["n"] for f in lines}) == len(lines) and code == 1000
    assert lines == read(api, job)[:-1]


def test_the_follow_socket_refuses_outsiders_and_bad_queries(api, catalog, logs_node, web_server, outsider, user):
    job = submit_job(api, catalog, command="echo hi")
    wait_status(job.workload, "succeeded", poke=reconcile(logs_node))

    async def code_of(url, cookie):
        headers = {"Origin": "http://127.0.0.1", "Cookie": cookie}
        async with websockets.connect(url, additional_headers=headers) as ws:
            frames, code = await frames_until_closed(ws, 20)
        return frames, code

    theirs = asyncio.run(code_of(follow_url(web_server, job), session_cookie(outsider)))
    bad = asyncio.run(code_of(follow_url(web_server, job, tail="x"), session_cookie(user)))
    mine = asyncio.run(code_of(follow_url(web_server, job), session_cookie(user)))
    assert theirs == ([], 4404) and bad[1] == 4400
    assert [f.get("line") for f in mine[0]][0] == "hi" and "end" in mine[0][-1] and mine[1] == 1000


def test_an_instances_log_is_read_the_same_way(api, catalog, logs_node, settings):
    settings.INSTANCE_IDLE_COMMAND = ["sh", "-c", "echo instance up; trap 'exit 0' TERM; while :; do sleep 1; done"]
    assert create(api, catalog).status_code == 201
    instance = Instance.objects.get()
    wait_status(instance.workload, "running")
    wait_for(lambda: (s := worklogs.state_read(instance.workload.pk, 1)) and s.seq >= 1, what="the first line")
    response = api.get(f"/api/v1/instances/{instance.pk}/logs/")
    *lines, end = [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]
    assert texts(lines) == ["instance up"] and end["end"] == end["end"] | {"status": "running", "finished": False}


def test_the_console_shows_a_logs_panel_to_the_owner_only(api, catalog, sim_node, user, outsider):
    from django.test import Client

    job = submit_job(api, catalog, command="echo hi")
    assert create(api, catalog).status_code == 201
    instance = Instance.objects.get()
    mine, theirs = Client(), Client()
    mine.force_login(user)
    theirs.force_login(outsider)
    page = mine.get(f"/jobs/{job.pk}/").content.decode()
    assert f'data-socket="/ws/logs/jobs/{job.pk}/"' in page
    assert f'data-download="/api/v1/jobs/{job.pk}/logs/?format=text&amp;download=1"' in page
    tab = mine.get(f"/instances/{instance.pk}/logs/")
    assert tab.status_code == 200 and f'data-socket="/ws/logs/instances/{instance.pk}/"' in tab.content.decode()
    assert f'href="/instances/{instance.pk}/logs/"' in mine.get(f"/instances/{instance.pk}/").content.decode()
    assert theirs.get(f"/instances/{instance.pk}/logs/").status_code == 404


def test_pieces_on_two_hosts_are_read_in_order_each_from_its_own_hosts_relay(
    api, catalog, sim_node, settings, tmp_path
):
    from django.db.models.functions import Now

    from agent.relay.server import RelayServer
    from scheduler.models import WorkloadEvent
    from tests.conftest import make_node

    settings.WORKLOG_DIR = tmp_path / "worklogs"
    job = submit_job(api, catalog, command="train")
    workload = job.workload
    hosts, relays = [make_node(), make_node()], []
    for host in hosts:
        relay = RelayServer(host.name, api=docker_client().api, host="127.0.0.1", port=0)
        host.relay_url, host.relay_tls_sha256 = relay.start(), relay.tls_sha256
        host.save(update_fields=["relay_url", "relay_tls_sha256"])
        relays.append(relay)
    try:
        for number, host in ((1, hosts[0]), (2, hosts[1])):
            WorkloadRun.objects.create(workload=workload, number=number, node=host, node_name=host.name)
            worklogs.run_begin(
                workload_id=workload.pk, uid=workload.uid, owner_id=workload.owner_id, run=number, container="c"
            )
            writer = worklogs.RunWriter(workload.pk, worklogs.state_read(workload.pk, number))
            with writer.lock:
                for i in range(3):
                    writer.append("stdout", worklogs.now_t(), f"run {number} step {i}")
                writer.finish(143 if number == 1 else 0)
            if number == 1:
                WorkloadEvent.objects.create(
                    workload=workload, from_status="stopping", to_status="queued",
                    reason="preempted; queued to resume from its checkpoint",
                )  # fmt: skip
        Workload.objects.filter(pk=workload.pk).update(
            status="succeeded", exit_code=0, status_reason="finished (exit code 0)", status_changed_at=Now()
        )
        *lines, end = read(api, job)
        assert [line["line"] for line in lines] == [
            "run 1 step 0", "run 1 step 1", "run 1 step 2",
            "— preempted; queued to resume from its checkpoint —",
            f"— resumed on host {hosts[1].name} —",
            "run 2 step 0", "run 2 step 1", "run 2 step 2",
            "— succeeded: finished (exit code 0) —",
        ]  # fmt: skip
        assert end["end"]["finished"] and end["end"]["cursor"] == lines[-1]["n"]

        relays.pop(0).stop()  # the first host does not answer: the read says so instead of skipping its piece
        assert api.get(f"/api/v1/jobs/{job.pk}/logs/").status_code == 409
        type(hosts[0]).objects.filter(pk=hosts[0].pk).update(status=NodeStatus.LOST)
        said = [line.get("line") for line in read(api, job)[:-1]]
        assert said[0] == f"… the output of this run on host {hosts[0].name} is unavailable (the host is lost)"
        assert said[3:6] == ["run 2 step 0", "run 2 step 1", "run 2 step 2"]
    finally:
        for relay in relays:
            relay.stop()
