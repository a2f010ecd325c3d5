"""Logs of jobs and instances: one log per workload, read piece by piece from the hosts that ran it.

A workload's log is the pieces of its runs (``scheduler.WorkloadRun``: each start of its container,
on one node), read in order through each node's relay (``Op.LOGS``; the web tier never touches
Docker), joined with the platform's own "system" lines:

    cursor k.000000000000   run k > 1 begins: "resumed on host X" (jobs) / "started again on host X"
    cursor k.999999999998   run k's piece is on a lost or removed host: unavailable
    cursor k.999999999999   run k ended: why (a preemption, a stop); after the last run of finished
                            work: its status, reason and exit code

A gang's every member has runs of its own, on its host (rank 0's first, then the others' as they
start): each member's piece begins "— rank r on host X —", a placement's end marker follows its last
member's piece, and every line of a gang's log carries its ``rank`` and ``host`` (after the fields
above: a reader of single-node logs reads them unchanged). ``rank`` keeps one member's runs only.
Followed live, rank 0's piece comes as it is written and the other members' each once rank 0's
ended (``member_tails`` shows their last lines meanwhile).

Cursors ("<run>.<seq>", fixed width) sort as text in the log's order, across runs and hosts, so a
reader that resumes with ``after`` gets no line twice and loses none. ``log_lines`` yields the wire
lines (bytes, one JSON object and a newline each) and, last, the ``{"end": ...}`` line; with
``follow`` it keeps reading as the work runs (and runs again) until the work has finished and every
piece has been read to its end. It streams: nothing is held but the line at hand (``tail`` holds
at most its lines).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import requests
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from core.errors import InvalidInput, NotFound, ServiceError
from core.relay import Op, Ticket, ticket_sign
from core.relay_tls import relay_http
from portal.models import Instance, Job
from portal.services.relay import CONNECT_S, IDLE_S, RENEW_S, SessionSlot, refusal, relay_base_of, unreachable
from scheduler.models import NodeStatus, Workload, WorkloadKind, WorkloadRun, WorkloadStatus

log = logging.getLogger(__name__)
S = WorkloadStatus
END_SEQ = 10**12 - 1
UNAVAILABLE_SEQ = END_SEQ - 1
TAIL_MAX = 100_000
MEMBER_TAIL = 10  # the job page's last lines of each gang member
RANK_MAX = 9999
ACTIVE = {S.QUEUED, S.STARTING, S.RUNNING, S.STOPPING}
HOLDING = set(S.holding_resources())
WAIT_S = 0.5  # between looks at the database while followed work waits for its next run or its end,
WAIT_MAX_S = 5.0  # ... growing to this while nothing changes
SETTLE_S = 30  # finished work whose last piece is still not complete after this is taken as complete
FOLLOW_IDLE_S = 60  # the relay writes a keep-alive every 15 s while following
LOG_READS_PER_USER = 4  # a user's log reads over HTTP under way at once (each holds a web worker and a relay thread)
_RELATIVE = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


@dataclass(frozen=True)
class Query:
    after: tuple[int, int] | None = None
    tail: int = 0
    since: str = ""  # the wire's time format ("2026-12-01T07:40:00.000000Z")
    follow: bool = False
    rank: int | None = None  # a gang's member's lines only


def wire_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def cursor(run: int, seq: int) -> str:
    return f"{run:06d}.{seq:012d}"


def query_parse(params, *, follow: bool = False) -> Query:
    """The query of a log read (``tail``, ``since``, ``after``); InvalidInput naming the field."""
    after = None
    if text := params.get("after", ""):
        run, dot, seq = text.partition(".")
        if not (dot and run.isdigit() and seq.isdigit() and len(run) == 6 and len(seq) == 12):
            raise InvalidInput("a cursor from this log (its lines' n)", field="after")
        after = (int(run), int(seq))
    tail = 0
    if text := params.get("tail", ""):
        if not text.isdigit() or not 0 < int(text) <= TAIL_MAX:
            raise InvalidInput(f"a number of lines from 1 to {TAIL_MAX}", field="tail")
        tail = int(text)
    since = ""
    if text := params.get("since", ""):
        if match := _RELATIVE.fullmatch(text):
            moment = timezone.now() - timedelta(**{_UNITS[match[2]]: int(match[1])})
        else:
            moment = parse_datetime(text)
            if moment is None:
                raise InvalidInput("an ISO-8601 time or a duration like 10m, 2h, 1d", field="since")
            if timezone.is_naive(moment):
                moment = timezone.make_aware(moment, UTC)
        since = wire_time(moment)
    rank = None
    if text := params.get("rank", ""):
        if not text.isdigit() or int(text) > RANK_MAX:
            raise InvalidInput(f"a gang member's rank, from 0 to {RANK_MAX}", field="rank")
        rank = int(text)
    return Query(after=after, tail=tail, since=since, follow=follow, rank=rank)


def log_workload(*, user, kind: str, object_id: int) -> Workload:
    """The workload of the user's own job or instance (``kind``: "jobs" / "instances"); NotFound otherwise."""
    model = Job if kind == "jobs" else Instance
    found = model.objects.filter(pk=object_id, owner=user).select_related("workload").first()
    if found is None:
        raise NotFound(f"no such {'job' if kind == 'jobs' else 'instance'}")
    return found.workload


def _system(run: int, seq: int, moment: datetime, text: str, tag: dict | None = None) -> bytes:
    line = {"n": cursor(run, seq), "t": wire_time(moment), "stream": "system", "line": text} | (tag or {})
    return json.dumps(line, ensure_ascii=False).encode() + b"\n"


def _tagged(line: bytes, tag: dict | None) -> bytes:
    """A stored line (one JSON object, no newline) with the tag's fields added last."""
    if not tag:
        return line
    return line[:-1] + b"," + json.dumps(tag, ensure_ascii=False).encode()[1:]


def _end_reason(workload: Workload, run: WorkloadRun, until: datetime | None) -> tuple[str, datetime]:
    """Why run ``run`` ended (the first change after its start that left the running states)."""
    events = workload.events.filter(created_at__gte=run.started_at).exclude(to_status__in=HOLDING)
    if until is not None:
        events = events.filter(created_at__lte=until)
    event = events.order_by("created_at", "id").first()
    if event is None:
        return "stopped", run.started_at
    return event.reason or event.to_status, event.created_at


def _final(workload: Workload) -> str:
    reason = workload.status_reason or workload.status
    said = f"{workload.status}: {reason}" if not reason.startswith(workload.status) else reason
    if workload.exit_code is not None and "code" not in said:
        said += f" (exit code {workload.exit_code})"
    return f"— {said} —"


class _Reader:
    """One read of a workload's log: the pieces in order, the markers, the end."""

    def __init__(self, workload: Workload, query: Query, alive: Callable[[], bool]):
        self.workload, self.query, self.alive = workload, query, alive
        self.after = query.after or (0, -1)
        self.complete: set[int] = set()  # runs whose piece has been read to its end
        self.last: str | None = None
        # A gang's log (of any placement: an elastic gang may come back to one node) tags every line.
        self.gang = workload.is_gang or workload.runs.filter(rank__gt=0).exists()

    def _tag(self, run: WorkloadRun) -> dict | None:
        """What each line of a gang's run carries after its own fields: its member's rank and host."""
        return {"rank": run.rank, "host": run.node_name} if self.gang or run.rank else None

    def _emit(self, line: bytes, position: tuple[int, int]) -> bytes:
        self.after = position
        self.last = cursor(*position)
        return line

    def lines(self) -> Iterator[bytes]:
        if self.query.tail:
            yield from self._tail()
        wait = WAIT_S
        while True:
            self.workload.refresh_from_db()
            runs = self._runs()
            active, seen = self.workload.status in ACTIVE, (self.last, self.workload.status, len(runs))
            for index, run in enumerate(runs):
                if run.number < self.after[0]:
                    continue
                is_last = index == len(runs) - 1
                yield from self._run(run, runs, is_last=is_last, active=active, follow=self.query.follow)
            self.workload.refresh_from_db()
            if self._finished(runs) or not self.query.follow or not self.alive():
                break
            # Waiting for the next run or the end (a queued job may wait long): look less often while
            # nothing moves, at once again after something did.
            moved = seen != (self.last, self.workload.status, len(self._runs()))
            wait = WAIT_S if moved else min(wait * 2, WAIT_MAX_S)
            time.sleep(wait)
        yield json.dumps({"end": self.end(runs)}).encode() + b"\n"

    def _runs(self) -> list[WorkloadRun]:
        runs = self.workload.runs.select_related("node").order_by("number")
        return list(runs if self.query.rank is None else runs.filter(rank=self.query.rank))

    def _may_wait(self) -> bool:
        """Whether to wait for more of a piece: while the work is active, and a while after (the collector
        stores the last lines after the container stopped); past that, a piece is what it is."""
        if self.workload.status in ACTIVE:
            return True
        settled = self.workload.status_changed_at or timezone.now()
        return (timezone.now() - settled).total_seconds() < SETTLE_S

    def _finished(self, runs: list[WorkloadRun]) -> bool:
        if self.workload.status in ACTIVE:
            return False
        return all(run.number in self.complete for run in runs) or not self._may_wait()

    def end(self, runs: list[WorkloadRun]) -> dict:
        workload = self.workload
        return {
            "status": workload.status,
            "exit_code": workload.exit_code,
            "reason": workload.status_reason,
            "cursor": self.last or (cursor(*self.query.after) if self.query.after else None),
            "finished": self._finished(runs),
        }

    def _wanted(self, position: tuple[int, int], moment: datetime | None = None) -> bool:
        if position <= self.after:
            return False
        return not (self.query.since and moment is not None and wire_time(moment) < self.query.since)

    def _run(self, run, runs, *, is_last: bool, active: bool, follow: bool, tail: int = 0) -> Iterator[bytes]:
        k, tag = run.number, self._tag(run)
        if run.rank and self._wanted((k, 0), run.started_at):
            yield self._emit(_system(k, 0, run.started_at, f"— rank {run.rank} on host {run.node_name} —", tag), (k, 0))
        elif k > 1 and self._wanted((k, 0), run.started_at):
            verb = "resumed" if self.workload.kind == WorkloadKind.JOB else "started again"
            yield self._emit(_system(k, 0, run.started_at, f"— {verb} on host {run.node_name} —", tag), (k, 0))
        if k not in self.complete:
            # Of the latest placement: no later run of a lower or the same rank (a gang's members begin theirs
            # one after another, each on its own host: one may not be there yet).
            latest = not any(later.rank <= run.rank for later in runs[runs.index(run) + 1 :])
            yield from self._piece(run, follow=follow and self._may_wait(), tail=tail, last_run=latest)
        following_run = None if is_last else runs[runs.index(run) + 1]
        # A placement ends after its last member's piece (the next run is a later placement's rank 0).
        placement_ends = following_run is None or following_run.rank <= run.rank
        if (not is_last or not active) and k in self.complete and placement_ends:
            following = following_run.started_at if following_run is not None else None
            if is_last:
                text, moment = _final(self.workload), self.workload.status_changed_at or timezone.now()
            else:
                reason, moment = _end_reason(self.workload, run, following)
                text = f"— {reason} —"
            if self._wanted((k, END_SEQ), moment):
                yield self._emit(_system(k, END_SEQ, moment, text, tag), (k, END_SEQ))

    def _piece(self, run, *, follow: bool, tail: int, last_run: bool) -> Iterator[bytes]:
        k, tag = run.number, self._tag(run)
        node = run.node
        if node is None or node.status in (NodeStatus.LOST, NodeStatus.REMOVED) or not node.relay_url:
            why = "removed" if node is None or node.status == NodeStatus.REMOVED else "lost"
            if self._wanted((k, UNAVAILABLE_SEQ), run.started_at):
                text = f"… the output of this run on host {run.node_name} is unavailable (the host is {why})"
                yield self._emit(_system(k, UNAVAILABLE_SEQ, run.started_at, text, tag), (k, UNAVAILABLE_SEQ))
            self.complete.add(k)
            return
        url = f"{relay_base_of(node)}/v1/{Op.LOGS}"
        while True:
            after_seq = self.after[1] if self.after[0] == k else 0
            ticket = Ticket(
                op=Op.LOGS,
                container=self.workload.container_name,
                workload=self.workload.pk,
                user=self.workload.owner_id,
                run=k,
                after=max(0, after_seq),
                tail=tail,
                since=self.query.since,
                follow=follow,
            )
            headers = {"Authorization": f"Bearer {ticket_sign(ticket)}"}
            timeout = (CONNECT_S, FOLLOW_IDLE_S if follow else IDLE_S)
            try:
                with relay_http(node.relay_tls_sha256).get(
                    url, headers=headers, stream=True, timeout=timeout
                ) as response:
                    if response.status_code == 404:  # nothing collected there (yet: a launch in progress)
                        if not (last_run and self.workload.status in ACTIVE):
                            self.complete.add(k)
                        return
                    if response.status_code != 200:
                        raise refusal(response.status_code, response.raw.read(64 * 1024, decode_content=True))
                    for line in response.iter_lines(chunk_size=64 * 1024):
                        if line.startswith(b'{"n":"'):
                            yield self._emit(_tagged(line, tag) + b"\n", (k, int(line[13:25])))
                        elif line.startswith(b'{"piece"'):
                            if json.loads(line)["piece"]["finished"]:
                                self.complete.add(k)
                            return
                        elif not self.alive():
                            return
            except requests.RequestException as exc:
                if not follow:
                    raise unreachable(exc) from exc
                log.info("following run %s of workload %s: %r; again", k, self.workload.pk, exc)
            if not follow or not self.alive():
                return
            time.sleep(1)  # the host's relay is restarting: read again from the last line

    def _tail(self) -> Iterator[bytes]:
        """The last ``tail`` lines (markers included) of the whole log, from the newest run back."""
        self.workload.refresh_from_db()
        runs = self._runs()
        active = self.workload.status in ACTIVE
        wanted, start = self.query.tail, self.after
        collected: list[tuple[bytes, tuple[int, int]]] = []
        for index in range(len(runs) - 1, -1, -1):
            run = runs[index]
            if run.number < start[0]:
                break
            self.after = start
            piece = []
            for line in self._run(
                run, runs, is_last=index == len(runs) - 1, active=active, follow=False, tail=wanted - len(collected)
            ):
                piece.append((line, self.after))
            collected = piece + collected
            if len(collected) >= wanted:
                break
        collected = collected[-wanted:]
        self.after = start
        for line, position in collected:
            yield self._emit(line, position)
        self.complete.clear()  # the tail read pieces partly: the follow-up reads them from the cursor


def log_lines(workload: Workload, *, query: Query, alive: Callable[[], bool] = lambda: True) -> Iterator[bytes]:
    """The wire lines of ``workload``'s log for ``query``, then its ``{"end": ...}`` line."""
    return _Reader(workload, query, alive).lines()


class LogReadSlot(SessionSlot):
    """One of the user's LOG_READS_PER_USER log reads over HTTP, a lease in Redis as a relay session's (every
    web server counts in it; a crashed one's come back by themselves)."""

    pool = "log-reads"

    def limit(self) -> tuple[int, str]:
        cap = LOG_READS_PER_USER
        return cap, f"you have {cap} log reads under way, the most at once: wait until one of them ends"


def log_read(workload: Workload, *, query: Query, user_id: int) -> Iterator[bytes]:
    """``log_lines`` holding one of the user's log read slots (TooMany beyond them) until the read ends or its
    client goes (the server closes the iterator). The slot is taken at the first line asked for."""
    slot = LogReadSlot(user_id).take()
    renewed = time.monotonic()
    try:
        for line in log_lines(workload, query=query):
            if time.monotonic() - renewed > RENEW_S:
                slot.renew()
                renewed = time.monotonic()
            yield line
    finally:
        slot.release()


def member_tail(workload: Workload, rank: int, count: int = MEMBER_TAIL) -> list[str] | None:
    """The last ``count`` lines of a gang's member's output (its own runs, through its hosts' relays, the
    platform's markers included); None when a host that holds them does not answer."""
    try:
        lines = list(log_lines(workload, query=Query(tail=count, rank=rank)))
    except ServiceError as exc:
        log.info("the last lines of rank %s of workload %s: %s", rank, workload.pk, exc)
        return None
    return [json.loads(line)["line"] for line in lines[:-1]]


def logs_panel(kind: str, object_id: int) -> dict:
    """What the console's log panel (``_logs.html``) needs: its follow socket and its download."""
    return {
        "socket": f"/ws/logs/{kind}/{object_id}/",
        "download": reverse(f"api-{kind[:-1]}-logs", args=[object_id]) + "?format=text&download=1",
    }


def as_text(lines: Iterator[bytes]) -> Iterator[bytes]:
    """The plain-text form: each line's text (system lines too), no end object."""
    for line in lines:
        item = json.loads(line)
        if "line" in item:
            where = f"[rank {item['rank']} on {item['host']}] " if "rank" in item else ""
            yield (where + item["line"]).encode() + b"\n"
