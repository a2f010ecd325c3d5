"""The log collector: each of this host's containers' stdout/stderr, followed into ``worklogs``' files.

One thread per container whose run is open here reads Docker's log of it (``follow``, ``timestamps``,
from the run's newest timestamp taken, so an agent restart resumes without a line twice), a flusher
commits every writer each COMMIT_S (the latency of a followed log), and a watcher starts followers
when Docker starts a container and scans every SCAN_S (agent start, a missed event): it also closes
runs whose container vanished unread and purges logs past their retention.

Output is bounded twice: Docker's own log (the launcher's ``log_config``: the "local" driver, capped,
non-blocking, so a flooding container never waits on the engine) and here, a token bucket of
WORKLOG_RATE_KB_S with bursts of WORKLOG_BURST_MB: lines beyond it are dropped and counted, and a
system line says how many bytes went before the next kept line (if the output ends while dropping,
its newest 64 KB still end the log). What Docker itself loses under a flood — its non-blocking
buffer overflowing, its log rotating under its own follower — never reaches the collector and cannot
be counted here: when the lines read lag the engine by over BEHIND_NS, the next marker says "at
least" (``bench/log_flood.py`` measures the whole). And the host's logs together are bounded: each scan
makes room (``worklogs.host_make_room``: the logs of ended work go first); when there is none, output
is not stored, with one system line saying why, and a line saying how much went once there is room.

Docker's log is not in time order: the engine stamps stdout's and stderr's lines in two copiers that race,
so a line can follow one of the other stream stamped after it (measured: a few in 6,000 alternating lines on a
busy host). Every line a read gives is kept, in the log's order; a reconnect reads from the newest time taken
(Docker's ``since``), so a line of one stream stamped just before it and logged after the break is the one
thing a reconnect can lose.

``settle(name)`` is called before a stopped container is removed: it waits (bounded) until its log
has been read to the end.
"""

from __future__ import annotations

import calendar
import collections
import functools
import logging
import threading
import time

import docker
from django.conf import settings

from agent import worklogs
from agent.labels import LABEL

log = logging.getLogger(__name__)
COMMIT_S = 0.1
SCAN_S = 5.0
PURGE_S = 600.0
SETTLE_S = 15.0
STALL_S = 30.0  # a follower with nothing from Docker this long reconnects
STREAMS = {1: "stdout", 2: "stderr"}
TS = len("2026-12-01T07:40:00.123456789Z")  # Docker's timestamps: fixed width (RFC 3339, nanoseconds)
NEWLINE = ord("\n")
BEHIND_NS = 2 * 10**9  # lines older than this when read: the follower is behind the engine's log
HOLD_BYTES = 64 * 1024  # the newest dropped output, kept aside to end the log if the output ends
RESUME_PART = 0.25  # dropping stops once the bucket holds this part of a burst again
GONE = "… the container was removed before its output was read to the end"
_active: Collector | None = None


def settle(name: str, timeout: float = SETTLE_S) -> None:
    """Before removing container ``name``: wait until its output is stored (no-op without a collector)."""
    collector = _active
    if collector is not None:
        collector.settle(name, timeout)


def _ns(ts: str) -> int:
    """Nanoseconds since the epoch of a Docker time in UTC: "2026-12-01T07:40:00.123456789Z" (log lines:
    always nine digits) or "...00.1234Z" (inspect's times drop trailing zeros)."""
    seconds = _second(ts[:19])
    fraction = ts[20:].rstrip("Z") if ts[19:20] == "." else ""
    if not fraction.isdigit() and fraction:
        raise ValueError(f"not a Docker UTC time: {ts!r}")
    return seconds * 10**9 + int(fraction[:9].ljust(9, "0") or 0)


def _body(response):
    """The bytes of a streamed answer as they come. Docker flushes each log line as its own HTTP chunk:
    read through urllib3 that costs ~20 µs a line, here ~2 (the socket's own buffered reader)."""
    reader = response.raw._fp.fp
    if response.headers.get("Transfer-Encoding", "").lower() != "chunked":
        while piece := reader.read1(256 * 1024):
            yield piece
        return
    while line := reader.readline(80):
        size = int(line.split(b";", 1)[0], 16)
        if size == 0:
            return
        yield reader.read(size)
        reader.read(2)  # the chunk's CRLF


@functools.lru_cache(maxsize=4)
def _second(text: str) -> int:
    return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def docker_time_ns(ts: str) -> int:
    """``_ns`` of a Docker time, 0 for what is not one (an empty field)."""
    try:
        return _ns(ts)
    except ValueError:
        return 0


class Follower:
    """Reads one container's log into its run's writer until the container stops."""

    def __init__(self, collector: Collector, container_id: str, workload_id: int, state: worklogs.RunState):
        self.collector, self.container_id, self.workload_id = collector, container_id, workload_id
        self.writer = worklogs.RunWriter(workload_id, state)
        self.thread = threading.Thread(target=self._run, name=f"log-{workload_id}", daemon=True)
        self._response = None
        self.received_at = time.monotonic()
        self._held: collections.deque = collections.deque()
        self._held_bytes = 0
        self._behind = False  # the collector fell behind Docker's log since the last marker
        rate = settings.WORKLOG_RATE_KB_S * 1024
        self._rate, self._burst = rate, max(rate, settings.WORKLOG_BURST_MB * 1024 * 1024)
        self._tokens, self._clock = float(self._burst), state.since_ns
        self._resume, self._paused = self._burst * RESUME_PART, False
        self._refused = False  # output is not stored: the host's logs have no room (the collector's no_room)

    def _run(self) -> None:
        exit_code, gone = None, False
        try:
            while not self.collector.stopping.is_set():
                ended = False  # Docker ended the stream itself: the container stopped and all was read
                try:
                    self._read()
                    ended = True
                except docker.errors.NotFound:
                    gone = True
                    break
                except Exception as exc:  # the engine restarted, the stream broke: read again from the last line
                    if self.collector.stopping.is_set():
                        return
                    log.info("log stream of %s broke: %r", self.container_id[:12], exc)
                    self.collector.stopping.wait(0.2)
                try:
                    attrs = self.collector.api.inspect_container(self.container_id)
                except docker.errors.NotFound:
                    gone = not ended
                    break
                if not attrs["State"].get("Running"):
                    exit_code = attrs["State"].get("ExitCode")
                    break
            else:
                return
            with self.writer.lock:
                state = self.writer.state
                if state.dropping and not self._refused:
                    self._last_lines()
                if gone:
                    self.writer.append("system", worklogs.now_t(), GONE)
                self.writer.finish(exit_code)
        except Exception:
            log.exception("collecting the log of workload %s failed", self.workload_id)
        finally:
            self.writer.close()

    def _read(self) -> None:
        api, state = self.collector.api, self.writer.state
        since_ns = _ns(state.last_ts) if state.last_ts else state.since_ns
        params = {
            "follow": 1,
            "stdout": 1,
            "stderr": 1,
            "timestamps": 1,
            "since": f"{since_ns // 10**9}.{since_ns % 10**9:09d}",
        }
        response = api._get(
            api._url("/containers/{0}/logs", self.container_id), params=params, stream=True, timeout=None
        )
        api._raise_for_status(response)
        self._response = response
        skip = state.at_last  # lines with exactly the last timestamp that were taken already
        buffer = bytearray()
        try:
            for chunk in _body(response):
                self.received_at = time.monotonic()
                buffer += chunk
                frames, position, length = [], 0, len(buffer)
                while length - position >= 8:
                    end = position + 8 + int.from_bytes(buffer[position + 4 : position + 8], "big")
                    if end > length:
                        break
                    frames.append((buffer[position], position + 8, end))
                    position = end
                if frames:
                    skip = self._take(buffer, frames, skip)
                    last = buffer[frames[-1][1] : frames[-1][1] + TS].decode()
                    if time.time_ns() - docker_time_ns(last) > BEHIND_NS:
                        self._behind = True  # Docker's own log, rotating under its follower, loses lines now
                    elif not self.writer.state.dropping:
                        self._behind = False
                del buffer[:position]
        finally:
            response.close()

    def _take(self, buffer: bytearray, frames: list, skip: int) -> int:
        """Store (or drop, over the rate) the frames ``(stream, start, end)`` of ``buffer``; returns how many
        lines with the last timestamp are still to be skipped (they were taken before a reconnect)."""
        state, writer = self.writer.state, self.writer
        # The bucket fills on the output's own time (its lines' timestamps), not on when they are read:
        # a backlog read late (an agent restart, a slow engine) is judged as it was printed.
        printed = docker_time_ns(buffer[frames[-1][1] : frames[-1][1] + TS].decode())
        if printed > self._clock:
            self._tokens = min(self._burst, self._tokens + (printed - self._clock) * self._rate / 10**9)
            self._clock = printed
        if self._paused and self._tokens >= self._resume:
            self._paused = False
        with writer.lock:
            if self._refuse(buffer, frames, skip):
                return 0
            if self._paused and not skip:
                self._drop_all(buffer, frames)
                return 0
            for stream, start, end in frames:
                ts = buffer[start : start + TS].decode()
                if ts > state.last_ts:
                    state.last_ts, state.at_last, skip = ts, 1, 0
                elif ts == state.last_ts:
                    if skip:  # taken before the reconnect (Docker's ``since`` gives its own time again)
                        skip -= 1
                        continue
                    state.at_last += 1
                # An earlier time than a line before it: the engine stamps stdout's and stderr's lines in two
                # copiers that race, so its log is not in time order. A line Docker gives is new (a reconnect's
                # ``since`` leaves out what is older than the newest line taken): keep it.
                size = end - start - TS - 1
                if self._paused or size > self._tokens:
                    self._paused = True  # until the bucket holds RESUME_PART of a burst: few markers
                    state.dropping += size
                    state.dropped_bytes += size
                    self._hold(stream, buffer, start, end)
                    continue
                self._tokens -= size
                t = ts[:26] + "Z"
                if state.dropping:
                    self._marker(t)
                text = buffer[start + TS + 1 : end - 1 if buffer[end - 1] == NEWLINE else end]
                writer.append(STREAMS.get(stream, "stdout"), t, text.decode(errors="replace"))
                state.kept_bytes += size
        return skip

    def _refuse(self, buffer: bytearray, frames: list, skip: int) -> bool:
        """While the host's logs have no room, count the frames as dropped; True if they were. Hold the
        writer's lock."""
        why, state = self.collector.no_room, self.writer.state
        if self._refused and not why:
            self.writer.append("system", worklogs.now_t(), f"… {state.dropping} bytes not kept (no room for logs)")
            state.dropping, self._refused = 0, False
            self._held.clear()
            self._held_bytes = 0
        if not why or skip:
            return False
        if not self._refused:
            if state.dropping:
                self._marker()
            self.writer.append("system", worklogs.now_t(), f"… output not kept from here: {why}")
            self._refused = True
        self._drop_all(buffer, frames)
        return True

    def _drop_all(self, buffer: bytearray, frames: list) -> None:
        """The bucket is empty: count the frames as dropped without looking into them (a flood costs little)."""
        state = self.writer.state
        size = frames[-1][2] - frames[0][1] - 8 * (len(frames) - 1) - (TS + 1) * len(frames)
        state.dropping += size
        state.dropped_bytes += size
        last = buffer[frames[-1][1] : frames[-1][1] + TS]
        same = 0
        for _, start, _ in reversed(frames):
            if buffer[start : start + TS] != last:
                break
            same += 1
        newest = last.decode()
        if newest > state.last_ts:  # the newest time taken only grows (a reconnect reads from it)
            state.last_ts, state.at_last = newest, same
        elif newest == state.last_ts:
            state.at_last += same
        newest, held = [], 0
        for frame in reversed(frames):
            if held >= HOLD_BYTES:
                break
            newest.append(frame)
            held += frame[2] - frame[1]
        for stream, start, end in reversed(newest):
            self._hold(stream, buffer, start, end)

    def _hold(self, stream: int, buffer: bytearray, start: int, end: int) -> None:
        """Keep the newest dropped lines aside: if the output ends while dropping, they end the log (a
        flood that ends in a traceback still shows the traceback)."""
        self._held.append((stream, bytes(buffer[start:end])))
        self._held_bytes += end - start
        while self._held_bytes > HOLD_BYTES and len(self._held) > 1:
            self._held_bytes -= len(self._held.popleft()[1])

    def _last_lines(self) -> None:
        """The output ended while dropping: the marker, then the held lines. Hold the writer's lock."""
        state, held = self.writer.state, list(self._held)
        kept = sum(len(payload) - TS - 1 for _, payload in held)
        state.dropping -= kept
        state.dropped_bytes -= kept
        if state.dropping > 0:
            self._marker(held[0][1][:26].decode() + "Z" if held else None)
        for stream, payload in held:
            text = payload[TS + 1 :].removesuffix(b"\n").decode(errors="replace")
            self.writer.append(STREAMS.get(stream, "stdout"), payload[:26].decode() + "Z", text)
            state.kept_bytes += len(payload) - TS - 1
        self._held.clear()
        self._held_bytes = 0

    def _marker(self, t: str | None = None) -> None:
        state = self.writer.state
        self._held.clear()
        self._held_bytes = 0
        said = f"… {state.dropping} bytes dropped (output faster than {settings.WORKLOG_RATE_KB_S} KB/s)"
        if self._behind:
            said = f"… at least {state.dropping} bytes dropped (output faster than {settings.WORKLOG_RATE_KB_S} KB/s"
            said += ", and than the engine's log is read)"
            self._behind = False
        self.writer.append("system", t or worklogs.now_t(), said)
        state.dropping = 0

    def commit(self) -> None:
        with self.writer.lock:
            self.writer.commit()

    def interrupt(self) -> None:
        response = self._response
        if response is not None:
            try:
                response.raw._fp.fp.raw._sock.shutdown(2)  # unblocks the read (close() alone does not)
            except Exception:  # already closed
                pass


class Collector:
    def __init__(self, node_name: str, api: docker.APIClient):
        self.node_name, self.api = node_name, api
        self.stopping = threading.Event()
        self._followers: dict[str, Follower] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._events = None
        self.no_room = ""  # why this host's logs have no room (worklogs.host_make_room), "" while they have

    def start(self) -> Collector:
        global _active
        _active = self
        for target, name in (
            (self._flush_forever, "log-flush"),
            (self._scan_forever, "log-scan"),
            (self._watch_starts, "log-watch"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        global _active
        self.stopping.set()
        if self._events is not None:
            try:
                self._events.close()  # ends the watcher's wait for Docker's next event
            except Exception:  # already closed
                pass
        with self._lock:
            followers = list(self._followers.values())
        for follower in followers:
            follower.interrupt()
        for follower in followers:
            follower.thread.join(5)
        for thread in self._threads:
            thread.join(5)
        if _active is self:
            _active = None

    def ensure(self, container: str) -> tuple[Follower | None, bool]:
        """A follower for ``container`` (id or name) if its run here is open; and whether it runs."""
        try:
            attrs = self.api.inspect_container(container)
        except docker.errors.NotFound:
            return None, False
        labels = attrs["Config"].get("Labels") or {}
        running = bool(attrs["State"].get("Running"))
        workload = labels.get(f"{LABEL}.workload", "")
        if (
            labels.get(f"{LABEL}.node") != self.node_name
            or labels.get(f"{LABEL}.deployment") != settings.DEPLOYMENT_ID
            or not workload.isdigit()
        ):
            return None, running
        with self._lock:
            follower = self._followers.get(attrs["Id"])
            if follower is not None and follower.thread.is_alive():
                return follower, running
            rank = labels.get(f"{LABEL}.rank", "0")
            state = worklogs.latest_runs(int(workload)).get(int(rank) if rank.isdigit() else 0)
            if state is None:
                return None, running  # started by no launch of this agent's (no run begun here)
            if state.container and state.container != attrs["Id"]:
                return None, running  # the run's container is another (this one is an earlier run's)
            if not state.container and docker_time_ns(attrs["State"].get("StartedAt", "")) < state.since_ns:
                return None, running  # last started before this run began: not (yet) the run's container
            if state.finished and not running:
                return None, running
            state.finished, state.container = False, attrs["Id"]  # a restarted container reopens its run
            follower = Follower(self, attrs["Id"], int(workload), state)
            self._followers[attrs["Id"]] = follower
            follower.thread.start()
            return follower, running

    def settle(self, name: str, timeout: float) -> None:
        follower, running = self.ensure(name)
        if follower is not None and not running:
            follower.thread.join(timeout)
            if follower.thread.is_alive():
                log.warning("the log of %s was not read to its end within %s s", name, timeout)

    def _flush_forever(self) -> None:
        while not self.stopping.wait(COMMIT_S):
            with self._lock:
                followers = list(self._followers.items())
                self._followers = {key: f for key, f in followers if f.thread.is_alive()}
            for _, follower in followers:
                try:
                    follower.commit()
                except Exception:
                    log.exception("committing the log of workload %s failed", follower.workload_id)

    def _watch_starts(self) -> None:
        filters = {"type": "container", "event": "start", "label": f"{LABEL}.node={self.node_name}"}
        while not self.stopping.is_set():
            try:
                self._events = self.api.events(decode=True, filters=filters)
                if self.stopping.is_set():  # stop() came while this connected
                    self._events.close()
                    return
                for event in self._events:
                    if self.stopping.is_set():
                        return
                    self.ensure(event["id"])
            except Exception:  # the engine restarted: the scan covers the gap
                log.exception("docker events for the log collector broke")
                self.stopping.wait(5)

    def _scan_forever(self) -> None:
        purged_at = 0.0
        while not self.stopping.is_set():
            try:
                live = self.scan()
                if time.monotonic() - purged_at > PURGE_S:
                    worklogs.purge(live_uids=live)
                    purged_at = time.monotonic()
            except Exception:
                log.exception("log collector scan failed")
            self.stopping.wait(SCAN_S)

    def scan(self) -> set[str]:
        """Follow every container of this node with an open run; close runs whose container is gone.
        Returns the uids of this node's containers."""
        labels = [f"{LABEL}.node={self.node_name}", f"{LABEL}.deployment={settings.DEPLOYMENT_ID}"]
        containers = self.api.containers(all=True, filters={"label": labels})
        with self._lock:
            followed = {key for key, f in self._followers.items() if f.thread.is_alive()}
        for container in containers:
            if container["Id"] not in followed:
                self.ensure(container["Id"])
        live = {c["Labels"].get(f"{LABEL}.uid", "") for c in containers}
        ids = {c["Id"] for c in containers}
        with self._lock:
            followers = [f for f in self._followers.values() if f.thread.is_alive()]
        now = time.monotonic()
        for follower in followers:
            if now - follower.received_at > STALL_S:
                # Docker's follower can stall for good when the log rotates under it (or outlive its
                # container): read again from the last line taken (a quiet container costs one call).
                follower.received_at = now
                follower.interrupt()
        following = {f.workload_id for f in followers}
        for workload_id in worklogs.open_runs():
            meta = worklogs.meta_read(workload_id) or {}
            if workload_id in following or meta.get("uid") in live:
                continue
            worklogs.run_close_unread(workload_id, known_containers=ids)
        self.no_room = worklogs.host_make_room()
        return live
