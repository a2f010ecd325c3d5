"""A host's log files (``worklogs``) on their own: a writer that crashed mid-way resumes without a line
twice, the cap removes the oldest segments and readers say so, retention purges released work only —
and the relay serves a log to its owner's ticket only, also after its container is gone."""

import json
import os
import time

import pytest
import requests

from config.relay import Op, Ticket, ticket_sign
from scheduler.node import worklogs
from scheduler.node.launcher import docker_client
from scheduler.node.relay.server import RelayServer
from tests.conftest import wait_for


@pytest.fixture(autouse=True)
def logs_dir(settings, tmp_path):
    settings.WORKLOG_DIR = tmp_path / "worklogs"
    return settings.WORKLOG_DIR


def begin(workload_id: int = 7, run: int = 1, owner: int = 3) -> worklogs.RunWriter:
    worklogs.run_begin(workload_id=workload_id, uid=f"uid{workload_id}", owner_id=owner, run=run, container="c")
    return worklogs.RunWriter(workload_id, worklogs.state_read(workload_id, run))


def write(writer: worklogs.RunWriter, texts, *, commit: bool = True) -> None:
    with writer.lock:
        for text in texts:
            writer.append("stdout", worklogs.now_t(), text)
        if commit:
            writer.commit()


def lines_of(workload_id: int = 7, run: int = 1, after: int = 0) -> list[dict]:
    return [json.loads(line) for line in worklogs.RunReader(workload_id, run, after=after).more()]


def test_lines_after_the_last_commit_are_dropped_on_restart_and_numbered_again():
    writer = begin()
    write(writer, ["a", "b"])
    write(writer, ["lost 1", "lost 2"], commit=False)  # flushed to the file, never committed: a crash
    writer._file.flush()
    writer.close()
    again = worklogs.RunWriter(7, worklogs.state_read(7, 1))
    write(again, ["c"])
    got = lines_of()
    assert [line["line"] for line in got] == ["a", "b", "c"]
    assert [line["n"] for line in got] == ["000001.000000000001", "000001.000000000002", "000001.000000000003"]
    assert [line["line"] for line in lines_of(after=2)] == ["c"]


def test_the_cap_removes_the_oldest_segments_and_the_reader_says_how_much(settings):
    settings.WORKLOG_MAX_MB = 1
    writer = begin()
    for i in range(30):
        write(writer, [f"{i:04d} " + "y" * 1000 for _ in range(100)])
    files = list(worklogs.workload_dir(7).glob("*.ndjson"))
    assert sum(f.stat().st_size for f in files) <= 1024 * 1024 + 140 * 1024
    got = lines_of()
    assert got[0]["stream"] == "system" and "bytes of older output dropped" in got[0]["line"]
    assert got[-1]["line"].startswith("0029 ")
    seqs = [int(line["n"][7:]) for line in got]
    assert seqs == sorted(seqs) and seqs[-1] == 3000
    tail = [json.loads(line) for line in worklogs.run_tail(7, 1, 3)]
    assert [int(line["n"][7:]) for line in tail] == [2998, 2999, 3000]


def test_a_reader_picks_up_only_new_complete_lines():
    writer = begin()
    write(writer, ["one"])
    reader = worklogs.RunReader(7, 1)
    assert [json.loads(x)["line"] for x in reader.more()] == ["one"]
    assert reader.more() == []
    seen = worklogs.changed.version(7)
    write(writer, ["two"])
    assert worklogs.changed.wait(7, seen, timeout=5) != seen
    assert [json.loads(x)["line"] for x in reader.more()] == ["two"]


def test_retention_purges_only_finished_logs_of_work_whose_container_is_gone(settings):
    settings.LOG_RETENTION_DAYS = 7
    for workload_id in (1, 2, 3):
        writer = begin(workload_id)
        write(writer, ["x"])
        with writer.lock:
            writer.finish(0)
    old = time.time() - 8 * 86400
    for workload_id in (1, 2):
        state = worklogs.state_read(workload_id, 1)
        state.ended_at = old
        worklogs.state_write(workload_id, state)
    assert worklogs.purge(live_uids={"uid2"}) == [1]  # 2's container is still there; 3 ended just now
    assert not worklogs.workload_dir(1).exists() and worklogs.workload_dir(2).exists()
    assert worklogs.workload_dir(3).exists()


def test_retention_leaves_a_log_whose_first_run_is_being_begun(settings):
    """A launch writes its meta, then its run's state: a purge in between (the collector's scan) must not
    take the folder (bench/log_flood.py met it: run_begin's write then found its folder gone)."""
    settings.LOG_RETENTION_DAYS = 7
    folder = worklogs.workload_dir(4)
    folder.mkdir(parents=True)
    worklogs._write_json(folder / "meta.json", {"workload": 4, "uid": "uid4", "deployment": settings.DEPLOYMENT_ID})
    assert worklogs.purge(live_uids=set()) == []
    assert folder.exists()

    old = time.time() - 8 * 86400
    os.utime(folder, (old, old))  # a launch that crashed there, a retention ago
    assert worklogs.purge(live_uids=set()) == [4]
    assert not folder.exists()


def test_the_relay_serves_a_log_to_its_owners_ticket_only(settings, db):
    writer = begin(workload_id=9, owner=3)
    write(writer, ["hello", "world"])
    with writer.lock:
        writer.finish(5)
    relay = RelayServer("node-x", api=docker_client().api, host="127.0.0.1", port=0)
    url = relay.start()
    try:

        def get(**fields):
            ticket = Ticket(**{"op": Op.LOGS, "container": "gone", "workload": 9, "user": 3, "run": 1, **fields})
            token = ticket_sign(ticket, secret=settings.RELAY_SECRET)
            return requests.get(f"{url}/v1/logs", headers={"Authorization": f"Bearer {token}"}, timeout=10)

        answer = get()
        assert answer.status_code == 200
        *lines, piece = [json.loads(x) for x in answer.content.splitlines()]
        assert [line["line"] for line in lines] == ["hello", "world"]
        assert piece == {"piece": {"finished": True, "exit_code": 5, "seq": 2, "kept_bytes": 0, "dropped_bytes": 0}}
        assert [json.loads(x) for x in get(after=1).content.splitlines()][0]["line"] == "world"
        assert [json.loads(x) for x in get(tail=1).content.splitlines()][0]["line"] == "world"
        assert get(user=4).status_code == 403
        assert get(workload=10).status_code == 404
        assert get(run=2).status_code == 404
        meta = worklogs.workload_dir(9) / "meta.json"
        meta.write_text(json.dumps(json.loads(meta.read_text()) | {"deployment": "another"}))
        assert get().status_code == 403
    finally:
        relay.stop()


def test_docker_times_are_read_with_and_without_trailing_zeros():
    from scheduler.node.collector import _ns

    assert _ns("2026-12-01T07:40:00.123456789Z") == 1796110800123456789
    assert _ns("2026-12-01T07:40:00.1234Z") == 1796110800123400000  # inspect's StartedAt drops zeros
    assert _ns("2026-12-01T07:40:00Z") == 1796110800000000000


def test_a_new_workload_with_an_old_ones_id_starts_an_empty_log():
    write(begin(workload_id=5), ["from an earlier database"])
    worklogs.run_begin(workload_id=5, uid="another", owner_id=3, run=1, container="c")
    assert lines_of(workload_id=5) == []


def test_a_stopped_collector_leaves_no_thread_behind():
    import threading

    from scheduler.node.collector import Collector

    before = set(threading.enumerate())
    collector = Collector("node-y", docker_client().api).start()
    wait_for(lambda: collector._events is not None, what="the watcher waiting on Docker's events")
    collector.stop()
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]
