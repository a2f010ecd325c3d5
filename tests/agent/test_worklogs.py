"""A host's log files (``worklogs``) on their own: a writer that crashed mid-way resumes without a line
twice, the cap removes the oldest segments and readers say so, retention purges released work only —
and the relay serves a log to its owner's ticket only, also after its container is gone."""

import json
import os
import shutil
import time

import pytest

from agent import worklogs
from agent.launcher import docker_client
from agent.relay.server import RelayServer
from core.relay import Op, Ticket, ticket_sign
from core.relay_tls import relay_http
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
    reader, lines = worklogs.RunReader(workload_id, run, after=after), []
    while not reader.caught_up:
        lines += [json.loads(line) for line in reader.more()]
    return lines


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
            token = ticket_sign(ticket)
            return relay_http(relay.tls_sha256).get(
                f"{url}/v1/logs", headers={"Authorization": f"Bearer {token}"}, timeout=10
            )

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
    from agent.collector import _ns

    assert _ns("2026-12-01T07:40:00.123456789Z") == 1796110800123456789
    assert _ns("2026-12-01T07:40:00.1234Z") == 1796110800123400000  # inspect's StartedAt drops zeros
    assert _ns("2026-12-01T07:40:00Z") == 1796110800000000000


def test_a_new_workload_with_an_old_ones_id_starts_an_empty_log():
    write(begin(workload_id=5), ["from an earlier database"])
    worklogs.run_begin(workload_id=5, uid="another", owner_id=3, run=1, container="c")
    assert lines_of(workload_id=5) == []


def test_a_stopped_collector_leaves_no_thread_behind():
    import threading

    from agent.collector import Collector

    before = set(threading.enumerate())
    collector = Collector("node-y", docker_client().api).start()
    wait_for(lambda: collector._events is not None, what="the watcher waiting on Docker's events")
    collector.stop()
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]


def test_each_rank_of_a_gang_has_its_own_open_run_and_a_new_run_replaces_only_its_ranks():
    """Members of one gang that share a log folder (two of a gang's earlier and later placements on one host; the
    test's hosts on one engine): a run begun for rank 1 leaves rank 0's open, a later rank 0 run closes only rank 0's,
    and a vanished container closes the run of its rank only."""
    worklogs.run_begin(workload_id=7, uid="uid7", owner_id=3, run=1, container="c0", rank=0)
    worklogs.run_begin(workload_id=7, uid="uid7", owner_id=3, run=2, container="c1", rank=1)
    assert {rank: s.run for rank, s in worklogs.latest_runs(7).items()} == {0: 1, 1: 2}
    assert not any(s.finished for s in worklogs.latest_runs(7).values())

    worklogs.run_begin(workload_id=7, uid="uid7", owner_id=3, run=3, container="c0", rank=0)
    assert worklogs.state_read(7, 1).finished and not worklogs.state_read(7, 2).finished
    assert {rank: s.run for rank, s in worklogs.latest_runs(7).items()} == {0: 3, 1: 2}

    for run, container in ((2, "id-rank1"), (3, "id-rank0")):
        state = worklogs.state_read(7, run)
        state.container = container
        worklogs.state_write(7, state)
    worklogs.run_close_unread(7, known_containers={"id-rank0"})  # rank 1's container is gone
    assert worklogs.state_read(7, 2).finished and not worklogs.state_read(7, 3).finished
    assert worklogs.open_runs() == [7]
    assert lines_of(run=2)[-1]["line"] == "… the container was removed before its output was read"


def finished(workload_id: int, texts, *, ended_at: float) -> None:
    writer = begin(workload_id)
    write(writer, texts)
    with writer.lock:
        writer.finish(0)
    state = worklogs.state_read(workload_id, 1)
    state.ended_at = ended_at
    worklogs.state_write(workload_id, state)


def test_the_hosts_logs_past_their_cap_lose_the_longest_ended_work_first_and_never_an_open_run(monkeypatch):
    monkeypatch.setattr(worklogs, "HOST_MAX_MB", 1)
    now = time.time()
    finished(1, ["x" * 1000] * 600, ended_at=now - 3600)  # ~660 KB, ended an hour ago
    finished(2, ["x" * 1000] * 300, ended_at=now - 60)
    write(begin(3), ["x" * 1000] * 500)  # still running

    assert worklogs.host_make_room() == ""
    assert not worklogs.workload_dir(1).exists()
    assert worklogs.workload_dir(2).exists() and worklogs.workload_dir(3).exists()

    write(worklogs.RunWriter(3, worklogs.state_read(3, 1)), ["x" * 1000] * 600)  # the running one alone passes it
    assert worklogs.host_make_room() == "this host's logs reached their 1 MB"
    assert not worklogs.workload_dir(2).exists()
    assert len(lines_of(3)) == 1100


def test_making_room_reads_an_ended_works_logs_once_until_a_run_opens_there_again(monkeypatch):
    finished(1, ["x" * 1000] * 10, ended_at=time.time() - 60)
    write(begin(2), ["y"])  # still running
    reads = []
    state_read = worklogs.state_read
    monkeypatch.setattr(worklogs, "state_read", lambda w, run: reads.append(w) or state_read(w, run))

    assert worklogs.host_make_room() == ""
    assert sorted(reads) == [1, 2]
    reads.clear()
    assert worklogs.host_make_room() == ""
    assert reads == [2]  # the ended one is known; the open run is read again

    begin(1, run=2)  # the ended work runs here again (a restart): its folder changed
    reads.clear()
    monkeypatch.setattr(worklogs, "HOST_MAX_MB", 0)
    assert worklogs.host_make_room() == "this host's logs reached their 0 MB"
    assert sorted(reads) == [1, 1, 2] and worklogs.workload_dir(1).exists()  # open again: never removed


def test_a_disk_under_its_free_floor_loses_every_ended_log_and_says_so(monkeypatch, logs_dir):
    finished(1, ["x"], ended_at=time.time())
    write(begin(2), ["y"])
    free_mb = shutil.disk_usage(logs_dir).free // worklogs.MB
    monkeypatch.setattr(worklogs, "MIN_FREE_MB", free_mb + 1024)

    assert worklogs.host_make_room() == f"this host's log disk has under {free_mb + 1024} MB free"
    assert not worklogs.workload_dir(1).exists() and worklogs.workload_dir(2).exists()


def frames(*texts: str) -> tuple[bytearray, list]:
    """Docker's multiplexed log frames (stdout, with timestamps) of ``texts``, printed now; and where each is."""
    buffer, where = bytearray(), []
    for text in texts:
        ns = time.time_ns()
        payload = (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns % 10**9:09d}Z {text}\n"
        ).encode()
        where.append((1, len(buffer) + 8, len(buffer) + 8 + len(payload)))
        buffer += bytes([1, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload
    return buffer, where


def stamped(*lines: tuple[int, int, str]) -> tuple[bytearray, list]:
    """Docker's frames of ``(stream, nanoseconds, text)`` lines, in the order given (1 stdout, 2 stderr)."""
    buffer, where = bytearray(), []
    for stream, ns, text in lines:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns % 10**9:09d}Z"
        payload = f"{stamp} {text}\n".encode()
        where.append((stream, len(buffer) + 8, len(buffer) + 8 + len(payload)))
        buffer += bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload
    return buffer, where


def test_a_line_logged_after_a_later_stamped_line_of_the_other_stream_is_kept_and_a_reconnect_repeats_none():
    """Docker stamps stdout and stderr in two racing copiers: its log is not in time order (the CI lost a
    training script's first stdout line, logged after Lightning's stderr lines stamped later)."""
    from agent.collector import Collector, Follower

    collector = Collector("node-y", docker_client().api)
    begin(7)
    follower = Follower(collector, "container-id", 7, worklogs.state_read(7, 1))
    t = time.time_ns()
    skip = follower._take(*stamped((2, t + 2000, "GPU available: False"), (1, t + 1000, "start: fresh")), 0)
    follower._take(*stamped((2, t + 3000, "fit begins"), (2, t + 3000, "same time")), skip)
    follower.commit()
    state = follower.writer.state
    assert (state.last_ts[20:29], state.at_last) == (f"{(t + 3000) % 10**9:09d}", 2), "the newest time taken"
    # A reconnect: Docker gives the lines from the newest time taken (its own time included), then new ones.
    again = Follower(collector, "container-id", 7, worklogs.state_read(7, 1))
    again._take(*stamped((2, t + 3000, "fit begins"), (2, t + 3000, "same time"), (1, t + 4000, "epoch 0")), 2)
    again.commit()

    got = [(line["stream"], line["line"]) for line in lines_of()]
    assert got == [
        ("stderr", "GPU available: False"),
        ("stdout", "start: fresh"),
        ("stderr", "fit begins"),
        ("stderr", "same time"),
        ("stdout", "epoch 0"),
    ]


def test_with_no_room_for_logs_the_collector_stores_no_output_and_says_why_then_how_much_went(monkeypatch):
    from agent.collector import Collector, Follower

    collector = Collector("node-y", docker_client().api)  # not started: its scan is called here
    write(begin(7), ["x" * 1000] * 50)
    follower = Follower(collector, "container-id", 7, worklogs.state_read(7, 1))

    def take(*texts):
        follower._take(*frames(*texts), 0)
        follower.commit()

    take("kept")
    monkeypatch.setattr(worklogs, "HOST_MAX_MB", 0)
    collector.scan()
    assert collector.no_room == "this host's logs reached their 0 MB"
    take("lost 1", "lost 2")
    take("lost 3")
    monkeypatch.setattr(worklogs, "HOST_MAX_MB", 1)
    collector.scan()
    assert collector.no_room == ""
    take("kept again")

    got = [(line["stream"], line["line"]) for line in lines_of()[50:]]
    assert got == [
        ("stdout", "kept"),
        ("system", "… output not kept from here: this host's logs reached their 0 MB"),
        ("system", "… 21 bytes not kept (no room for logs)"),
        ("stdout", "kept again"),
    ]


class ReadSpy:
    """A file of worklogs' whose reads are counted (bytes each read returned)."""

    def __init__(self, file, reads: list):
        self.file, self.reads = file, reads

    def read(self, size=-1):
        data = self.file.read(size)
        self.reads.append(len(data))
        return data

    def readline(self, size=-1):
        data = self.file.readline(size)
        self.reads.append(len(data))
        return data

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


@pytest.fixture
def reads(monkeypatch):
    """The bytes of each read of a log file; pages of 64 KB."""
    monkeypatch.setattr(worklogs, "READ_BYTES", 64 * 1024)
    done = []
    monkeypatch.setattr(worklogs, "open", lambda *a, **k: ReadSpy(open(*a, **k), done), raising=False)
    return done


def test_a_log_is_read_a_page_at_a_time_every_line_once(reads, settings):
    settings.WORKLOG_MAX_MB = 2  # segments of 256 KB
    writer = begin()
    write(writer, [f"{i:05d} " + "z" * 994 for i in range(1500)])  # ~1.6 MB

    reader, pages = worklogs.RunReader(7, 1), []
    while not reader.caught_up:
        pages.append(reader.more())
    assert [int(json.loads(line)["line"][:5]) for page in pages for line in page] == list(range(1500))
    assert len(pages) > 20 and max(sum(map(len, page)) for page in pages) <= 64 * 1024 + 1100
    assert max(reads) <= 64 * 1024 + 1100  # never a whole segment in memory

    reads.clear()
    tail = [json.loads(line)["line"][:5] for line in worklogs.run_tail(7, 1, 100)]
    assert tail == [f"{i:05d}" for i in range(1400, 1500)]
    assert sum(reads) <= 3 * 64 * 1024  # from the end back, no further than the lines asked for


def test_a_tail_read_backwards_leaves_out_a_line_still_being_written_and_joins_lines_across_pages(reads):
    texts = [f"{i:05d} " + "q" * (i * 7 % 3000) for i in range(400)]  # lines of up to 3 KB, across pages
    texts[200] += "w" * 100_000  # one longer than a page
    writer = begin()
    write(writer, texts)
    with writer.lock:
        writer._file.write(b'{"n":"000001.000000000401","t":"2026')  # being written, not yet committed
        writer._file.flush()

    assert [json.loads(line)["line"] for line in worklogs.run_tail(7, 1, 400)] == texts
    assert [json.loads(line)["line"] for line in worklogs.run_tail(7, 1, 2)] == texts[-2:]
    assert [line["line"] for line in lines_of()] == texts


def test_the_relay_serves_a_log_of_many_pages_whole(reads, settings, db):
    writer = begin(workload_id=9, owner=3)
    write(writer, [f"{i:05d} " + "r" * 500 for i in range(1000)])  # ~0.6 MB: ten pages
    with writer.lock:
        writer.finish(0)
    relay = RelayServer("node-x", api=docker_client().api, host="127.0.0.1", port=0)
    url = relay.start()
    try:
        ticket = Ticket(op=Op.LOGS, container="gone", workload=9, user=3, run=1)
        token = ticket_sign(ticket)
        answer = relay_http(relay.tls_sha256).get(
            f"{url}/v1/logs", headers={"Authorization": f"Bearer {token}"}, timeout=10
        )
    finally:
        relay.stop()
    *lines, piece = [json.loads(x) for x in answer.content.splitlines()]
    assert [int(line["line"][:5]) for line in lines] == list(range(1000))
    assert piece["piece"]["finished"] and piece["piece"]["seq"] == 1000
    assert max(reads) <= 64 * 1024 + 600
