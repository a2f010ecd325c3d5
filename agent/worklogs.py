"""A host's logs of its workloads: the files the collector appends to and the relay reads.

Everything lives under ``settings.WORKLOG_DIR``, one folder per workload::

    <workload id>/meta.json                        whose it is: owner, uid, deployment
    <workload id>/run-<run>.json                   one run's state (``RunState``), replaced atomically
    <workload id>/run-<run>-<first seq>.ndjson      the run's lines, in segments of about a cap's eighth

A run is one start of the workload's container (``scheduler.WorkloadRun``, numbered by the control
plane). Each stored line is the wire shape of ``core.relay`` already: ``{"n": "<run>.<seq>", "t":
..., "stream": ..., "line": ...}`` with fixed-width numbers, so cursors and times sort as text and a
reader passes lines on without decoding them. The state records how far the run's files are good
(segment and size) and the last Docker timestamp taken, so a collector that restarts truncates what
it wrote after its last commit and reads Docker again from there: no line twice, none lost.

A workload's files on one host hold at most ``WORKLOG_MAX_MB``: past it the oldest segment goes, and
the reader shows a system line saying how many bytes went. All of them together hold at most
HOST_MAX_MB and leave MIN_FREE_MB free on their disk (the agent's state disk, which also holds the
self-fence record), however many short jobs ran: ``host_make_room`` removes the logs of ended work,
the longest ended first, and when that is not enough the collector stores no more output until there
is room again (``agent.collector``). Readers learn of new lines from
``changed`` (same process: the agent runs the relay) or, failing that, by reading again.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from django.conf import settings

log = logging.getLogger(__name__)
MB = 1024 * 1024
END_SEQ = 10**12 - 1  # the web tier's end-of-run marker; agent lines stay below
_SEGMENT = re.compile(r"run-(\d{6})-(\d{12})\.ndjson")
_T_AT = slice(32, 59)  # where "t" sits in a stored line
_N_AT = slice(6, 25)
LAUNCH_GRACE_S = 3600  # a run begun here whose container never appeared is closed after this
READ_BYTES = 1024 * 1024  # the most of a log's files read into memory at once (a page of a read)
HOST_MAX_MB = 4096  # every workload's logs on this host together
MIN_FREE_MB = 1024  # the free space they leave on their disk


def cursor(run: int, seq: int) -> str:
    return f"{run:06d}.{seq:012d}"


def seq_of(line: bytes) -> int:
    """The sequence number of a stored line."""
    return int(line[_N_AT][7:])


def line_bytes(run: int, seq: int, t: str, stream: str, text: str) -> bytes:
    """One stored line (and wire line): ``t`` is "YYYY-MM-DDTHH:MM:SS.ffffffZ"."""
    return f'{{"n":"{cursor(run, seq)}","t":"{t}","stream":"{stream}","line":{json.dumps(text)}}}\n'.encode()


def now_t() -> str:
    ns = time.time_ns()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns // 1000 % 10**6:06d}Z"


@dataclass
class RunState:
    run: int
    since_ns: int  # Docker's log is read from here (a reused container's log holds earlier runs)
    container: str = ""
    last_ts: str = ""  # the newest Docker timestamp taken (RFC 3339, nanoseconds: sorts as text)
    at_last: int = 0  # lines taken with exactly that timestamp
    seq: int = 0  # the last line's number
    segment: int = 0  # first seq of the segment being written (0: none yet)
    segment_size: int = 0  # its good length
    kept_bytes: int = 0
    dropped_bytes: int = 0  # over the rate, with markers in the log
    dropping: int = 0  # dropped since the last marker (its marker is still to be written)
    head_dropped_bytes: int = 0  # whole segments removed for the size cap
    head_dropped_seq: int = 0  # the last line they held
    finished: bool = False
    exit_code: int | None = None
    ended_at: float = 0.0  # this host's clock, for retention only
    rank: int = 0  # a gang's member's rank (each member's host keeps its runs; 0 for single-node work)


# -- paths and state ---------------------------------------------------------------------------------


def workload_dir(workload_id: int) -> Path:
    return Path(settings.WORKLOG_DIR) / str(int(workload_id))


def _state_path(workload_id: int, run: int) -> Path:
    return workload_dir(workload_id) / f"run-{run:06d}.json"


def _segment_path(workload_id: int, run: int, first: int) -> Path:
    return workload_dir(workload_id) / f"run-{run:06d}-{first:012d}.ndjson"


def _write_json(path: Path, value: dict) -> None:
    temporary = path.with_suffix(".tmp")
    with open(temporary, "w") as f:
        json.dump(value, f)
    os.replace(temporary, path)


def meta_read(workload_id: int) -> dict | None:
    try:
        return json.loads((workload_dir(workload_id) / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def state_read(workload_id: int, run: int) -> RunState | None:
    try:
        return RunState(**json.loads(_state_path(workload_id, run).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def state_write(workload_id: int, state: RunState) -> None:
    _write_json(_state_path(workload_id, state.run), asdict(state))


def _entries(folder: Path) -> list[os.DirEntry]:
    """A folder's entries; none if it is gone (a purge, a test's temporary folder)."""
    try:
        return list(os.scandir(folder))
    except FileNotFoundError:
        return []


def runs_here(workload_id: int) -> list[int]:
    names = (entry.name for entry in _entries(workload_dir(workload_id)))
    return sorted(
        int(name[4:10]) for name in names if len(name) == 15 and name.startswith("run-") and name.endswith(".json")
    )


def segments(workload_id: int, run: int | None = None) -> list[tuple[int, int, Path]]:
    """(run, first seq, path) of the workload's segments here (of ``run`` only, if given), oldest first."""
    folder = workload_dir(workload_id)
    found = []
    for entry in _entries(folder):
        match = _SEGMENT.fullmatch(entry.name)
        if match and (run is None or int(match[1]) == run):
            found.append((int(match[1]), int(match[2]), Path(entry.path)))
    return sorted(found)


def latest_runs(workload_id: int) -> dict[int, RunState]:
    """The latest run here of each rank of the workload (one, rank 0, for single-node work)."""
    latest: dict[int, RunState] = {}
    for run in runs_here(workload_id):
        state = state_read(workload_id, run)
        if state is not None:
            latest[state.rank] = state
    return latest


def run_begin(*, workload_id: int, uid: str, owner_id: int, run: int, container: str, rank: int = 0) -> None:
    """Before the container of run ``run`` starts here: its state, reading Docker's log from now on.

    A run of this workload's ``rank`` still open here is finished first (its container is being replaced);
    files of another workload that had the same id (another deployment, or a database made anew) go.
    """
    folder = workload_dir(workload_id)
    known = meta_read(workload_id)
    if known is not None and (known.get("uid") != uid or known.get("deployment") != settings.DEPLOYMENT_ID):
        shutil.rmtree(folder, ignore_errors=True)  # another workload's under the same id (a database made anew)
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"workload": workload_id, "uid": uid, "owner": owner_id, "container": container}
    _write_json(folder / "meta.json", meta | {"deployment": settings.DEPLOYMENT_ID})
    for earlier in runs_here(workload_id):
        state = state_read(workload_id, earlier)
        if state is not None and not state.finished and earlier != run and state.rank == rank:
            state.finished, state.ended_at = True, time.time()
            state_write(workload_id, state)
    if state_read(workload_id, run) is None:
        state_write(workload_id, RunState(run=run, since_ns=time.time_ns(), rank=rank))
    changed.notify(workload_id)


def open_runs() -> list[int]:
    """Workloads whose latest run here (of some rank) is not finished."""
    root = Path(settings.WORKLOG_DIR)
    found = []
    for entry in _entries(root):
        if entry.name.isdigit() and any(not s.finished for s in latest_runs(int(entry.name)).values()):
            found.append(int(entry.name))
    return found


def run_close(workload_id: int, run: int, why: str) -> None:
    """Finish a run whose output will not be read (any more), saying why in a system line."""
    state = state_read(workload_id, run)
    if state is None or state.finished:
        return
    writer = RunWriter(workload_id, state)
    with writer.lock:
        writer.append("system", now_t(), why)
        writer.finish(None)


def run_close_unread(workload_id: int, *, known_containers: set[str]) -> None:
    """The latest run's (of each rank) container is gone from the engine: close it (the collector's scan).

    A run not followed yet is left alone for LAUNCH_GRACE_S: its container may still be being made.
    """
    for state in latest_runs(workload_id).values():
        if state.finished or state.container in known_containers:
            continue
        if not state.container and time.time_ns() - state.since_ns < LAUNCH_GRACE_S * 10**9:
            continue
        run_close(workload_id, state.run, "… the container was removed before its output was read")


# -- change notices (the relay in the agent's process waits on them) ----------------------------------


class _Changes:
    def __init__(self):
        self._condition = threading.Condition()
        self._versions: dict[int, int] = {}

    def version(self, workload_id: int) -> int:
        with self._condition:
            return self._versions.get(workload_id, 0)

    def notify(self, workload_id: int) -> None:
        with self._condition:
            self._versions[workload_id] = self._versions.get(workload_id, 0) + 1
            self._condition.notify_all()

    def wait(self, workload_id: int, seen: int, timeout: float) -> int:
        """Until the workload's version passes ``seen`` or ``timeout``; returns the version."""
        with self._condition:
            self._condition.wait_for(lambda: self._versions.get(workload_id, 0) != seen, timeout)
            return self._versions.get(workload_id, 0)


changed = _Changes()


# -- writing (the collector) --------------------------------------------------------------------------


class RunWriter:
    """Appends one run's lines; ``commit()`` makes them durable and visible (call it often)."""

    def __init__(self, workload_id: int, state: RunState):
        self.workload_id, self.state = workload_id, state
        self.lock = threading.Lock()
        self._file = None
        self._dirty = False
        self._recover()

    def _recover(self) -> None:
        """Drop what was written after the last commit: it is read from Docker again."""
        for _, first, path in segments(self.workload_id, self.state.run):
            if first > self.state.segment:
                path.unlink(missing_ok=True)
            elif first == self.state.segment:
                with open(path, "r+b") as f:
                    f.truncate(self.state.segment_size)

    def _segment_bytes(self) -> int:
        return max(64 * 1024, settings.WORKLOG_MAX_MB * MB // 8)

    def append(self, stream: str, t: str, text: str) -> int:
        """Store one line (without its newline); returns its size. Hold ``lock``."""
        state = self.state
        if self._file is None or state.segment_size >= self._segment_bytes():
            self._next_segment()
        state.seq += 1
        data = line_bytes(state.run, state.seq, t, stream, text)
        self._file.write(data)
        state.segment_size += len(data)
        self._dirty = True
        return len(data)

    def _next_segment(self) -> None:
        state = self.state
        if self._file is not None:
            self._file.close()
            self._file = None
        if state.segment == 0 or state.segment_size >= self._segment_bytes():
            state.segment, state.segment_size = state.seq + 1, 0
        path = _segment_path(self.workload_id, state.run, state.segment)
        self._file = open(path, "ab")  # noqa: SIM115  (closed by close())
        self._file.truncate(state.segment_size)

    def commit(self) -> None:
        """Flush, record how far the files are good, enforce the cap, wake readers. Hold ``lock``."""
        if not self._dirty:
            return
        if self._file is not None:
            self._file.flush()
        state_write(self.workload_id, self.state)
        self._dirty = False
        _cap(self.workload_id, current=self.state)
        changed.notify(self.workload_id)

    def finish(self, exit_code: int | None) -> None:
        """The container stopped and its log was read to the end. Hold ``lock``."""
        self.state.finished, self.state.exit_code, self.state.ended_at = True, exit_code, time.time()
        self._dirty = True
        self.commit()
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _cap(workload_id: int, *, current: RunState) -> None:
    """Remove the oldest segments (never the one being written) while the workload's files pass the cap."""
    present = segments(workload_id)
    sizes = {path: _size(path) for _, _, path in present}
    total, cap = sum(sizes.values()), settings.WORKLOG_MAX_MB * MB
    for index, (run, first, path) in enumerate(present[:-1]):
        if total <= cap:
            return
        if run == current.run and first == current.segment:
            return
        following = present[index + 1]
        last_seq = following[1] - 1 if following[0] == run else None
        state = current if run == current.run else state_read(workload_id, run)
        path.unlink(missing_ok=True)
        total -= sizes[path]
        if state is not None:
            state.head_dropped_bytes += sizes[path]
            state.head_dropped_seq = last_seq if last_seq is not None else state.seq
            if state is not current:
                state_write(workload_id, state)


# -- reading (the relay) ------------------------------------------------------------------------------


def head_marker(run: int, state: RunState) -> bytes:
    return line_bytes(
        run,
        state.head_dropped_seq,
        now_t(),
        "system",
        f"… {state.head_dropped_bytes} bytes of older output dropped (the log keeps {settings.WORKLOG_MAX_MB} MB)",
    )


def _complete_lines(path: Path, offset: int, limit: int) -> tuple[list[bytes], int, bool]:
    """Whole lines of ``path`` from byte ``offset``, about ``limit`` bytes of them (a line still being
    written waits); the new offset, and whether the file was read to its end."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(max(1, limit))
            if data and b"\n" not in data:
                data += f.readline()  # one line longer than the limit (a stored line is at most ~100 KB)
            at_end = f.tell() >= os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        return [], offset, True
    end = data.rfind(b"\n") + 1
    return data[:end].splitlines(keepends=True), offset + end, at_end


def _lines_backwards(path: Path) -> Iterator[list[bytes]]:
    """Whole lines of ``path`` from its end back, about READ_BYTES at a time (each batch in order; a line
    still being written is left out)."""
    limit = READ_BYTES
    try:
        f = open(path, "rb")  # noqa: SIM115  (closed below, also when the caller stops early)
    except FileNotFoundError:
        return
    with f:
        end, carry, last = f.seek(0, os.SEEK_END), b"", True
        while end > 0:
            start = max(0, end - limit)
            f.seek(start)
            data = f.read(end - start) + carry
            end = start
            if last:  # the file's end: what follows its last newline is still being written
                if b"\n" not in data:
                    continue
                data, last = data[: data.rfind(b"\n") + 1], False
            cut = data.find(b"\n") + 1 if start > 0 else 0
            if start > 0 and cut == 0:  # no line starts in what was read yet
                carry = data
                continue
            carry, data = data[:cut], data[cut:]
            if data:
                yield data.splitlines(keepends=True)


def _after(lines: list[bytes], after: int, run: int) -> list[bytes]:
    if not lines or after <= 0:
        return lines
    mark = cursor(run, after).encode()
    return [line for line in lines if line[_N_AT] > mark]


class RunReader:
    """Lines of one run after a cursor, as they come: ``more()`` gives what is new since the last call, a
    page of at most about READ_BYTES at a time (``caught_up`` says whether it reached the end)."""

    def __init__(self, workload_id: int, run: int, *, after: int = 0, since: str = ""):
        self.workload_id, self.run, self.after, self.since = workload_id, run, after, since.encode()
        self._segment: tuple[int, Path] | None = None
        self._offset = 0
        self.caught_up = False

    def state(self) -> RunState | None:
        return state_read(self.workload_id, self.run)

    def more(self) -> list[bytes]:
        state = self.state()
        out: list[bytes] = []
        self.caught_up, read, limit = True, 0, READ_BYTES
        if state is None:
            return out
        present = [(first, path) for _, first, path in segments(self.workload_id, self.run)]
        if state.head_dropped_seq > self.after and (not present or present[0][0] > self.after + 1):
            out.append(head_marker(self.run, state))  # what was after the cursor is gone: say so
            self.after = state.head_dropped_seq
        while True:
            if self._segment is None or self._segment not in present:
                start = [s for s in present if s[0] <= self.after + 1] or present[:1]
                if not start:
                    return self._since(out)
                self._segment, self._offset = start[-1], 0
            start = self._offset
            lines, self._offset, at_end = _complete_lines(self._segment[1], self._offset, limit - read)
            read += self._offset - start
            lines = _after(lines, self.after, self.run)
            if lines:
                self.after = seq_of(lines[-1])
                out.extend(lines)
            later = [s for s in present if s[0] > self._segment[0]]
            if at_end and later:
                self._segment, self._offset = later[0], 0
            if not (at_end and later) or read >= limit:
                self.caught_up = at_end and not later
                return self._since(out)

    def _since(self, lines: list[bytes]) -> list[bytes]:
        if not self.since:
            return lines
        return [line for line in lines if line[_T_AT] >= self.since]


def run_tail(workload_id: int, run: int, count: int, *, since: str = "") -> list[bytes]:
    """The last ``count`` lines of a run (after ``since``), reading segments from the newest back."""
    state = state_read(workload_id, run)
    if state is None or count <= 0:
        return []
    kept: list[bytes] = []  # never more than the lines asked for, and one batch being read
    for _, _, path in reversed(segments(workload_id, run)):
        for lines in _lines_backwards(path):
            if since:
                lines = [line for line in lines if line[_T_AT] >= since.encode()]
            kept = lines[-(count - len(kept)) :] + kept
            if len(kept) >= count:
                return kept
    if state.head_dropped_bytes and len(kept) < count:
        kept.insert(0, head_marker(run, state))
    return kept[-count:]


# -- retention ----------------------------------------------------------------------------------------


def purge(*, live_uids: set[str], now: float | None = None) -> list[int]:
    """Remove the logs of work whose container is gone (``live_uids``: this host's containers) and whose
    last run ended over LOG_RETENTION_DAYS ago; returns the workloads purged."""
    now = time.time() if now is None else now
    horizon = now - settings.LOG_RETENTION_DAYS * 86400
    root = Path(settings.WORKLOG_DIR)
    purged = []
    for entry in _entries(root):
        if not entry.name.isdigit():
            continue
        workload_id = int(entry.name)
        meta = meta_read(workload_id) or {}
        if meta.get("uid") in live_uids:
            continue
        states = [state_read(workload_id, run) for run in runs_here(workload_id)]
        if not states:
            # No run yet: a launch between its meta and its first run's state (run_begin), or one that
            # crashed there. Only a folder left so for the whole retention goes.
            ended = _mtime(entry.path) < horizon
        else:
            ended = all(s is not None and s.finished and s.ended_at < horizon for s in states)
        if ended:
            shutil.rmtree(entry.path, ignore_errors=True)
            purged.append(workload_id)
    return purged


# Ended work's logs, by folder: (its mtime in ns, when its last run ended, its bytes). They do not
# change until a run opens there again (a new run's files change the folder's mtime), so ``host_make_room``, every
# few seconds over thousands of ended jobs' folders, reads only the live ones and the ones that changed.
_ended_logs: dict[str, tuple[int, float, int]] = {}


def _logs_of(entry: os.DirEntry) -> tuple[float | None, int]:
    """(When the workload's last run here ended, None while one is open; the bytes of its logs.)"""
    workload_id = int(entry.name)
    try:
        mtime = entry.stat(follow_symlinks=False).st_mtime_ns
    except FileNotFoundError:
        return None, 0
    cached = _ended_logs.get(entry.path)
    if cached is not None and cached[0] == mtime:
        return cached[1], cached[2]
    size = _tree_size(entry.path)
    states = [state_read(workload_id, run) for run in runs_here(workload_id)]
    if states and all(s is not None and s.finished for s in states):
        ended = max(s.ended_at for s in states)
        _ended_logs[entry.path] = (mtime, ended, size)
        return ended, size
    _ended_logs.pop(entry.path, None)
    return None, size


def host_make_room() -> str:
    """Keep this host's logs within HOST_MAX_MB and their disk over MIN_FREE_MB free by removing the logs
    of ended work, the longest ended first (never those of a run still open). Returns "" when there is
    room, else why there is none (then the collector stores no more output)."""
    root = Path(settings.WORKLOG_DIR)
    root.mkdir(parents=True, exist_ok=True)
    ended, total, seen = [], 0, set()
    for entry in _entries(root):
        if not entry.name.isdigit():
            continue
        seen.add(entry.path)
        ended_at, size = _logs_of(entry)
        total += size
        if ended_at is not None:
            ended.append((ended_at, int(entry.name), entry.path, size))
    for gone in _ended_logs.keys() - seen:  # purged by retention, or another folder's (a test's)
        del _ended_logs[gone]
    for _, workload_id, path, size in sorted(ended):
        why = _no_room(root, total)
        if not why:
            return ""
        shutil.rmtree(path, ignore_errors=True)
        _ended_logs.pop(path, None)
        total -= size
        log.warning("removed the logs of ended workload %s: %s", workload_id, why)
    return _no_room(root, total)


def _no_room(root: Path, total: int) -> str:
    if total > HOST_MAX_MB * MB:
        return f"this host's logs reached their {HOST_MAX_MB} MB"
    if shutil.disk_usage(root).free < MIN_FREE_MB * MB:
        return f"this host's log disk has under {MIN_FREE_MB} MB free"
    return ""


def _tree_size(path: str) -> int:
    return sum(_size(Path(entry.path)) for entry in _entries(Path(path)) if entry.is_file(follow_symlinks=False))


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return float("inf")  # gone already: nothing to purge
