"""Live samples fanned out inside one WebSocket server process: one channel-layer receive per document.

The sampler publishes each document once to its group (``core.messages``). If every
monitor socket joined that group itself, each document would be received, decoded and
dispatched once per viewer, and Channels' dispatch hops to the single database thread for
every message (``close_old_connections``) — serial work that grows with the viewers: 1,000
viewers of one node waited ~400 ms for a sample while daphne idled (``bench/ws_viewers.py``).

Here a process holds one channel per watched group and one reader task for it; the reader
hands the document's text, as the sampler serialized it, to every socket watching the group
in turn, each send run until it waits (a slow socket delays no other's copy). Sockets join after they are
authorized (the consumer's ``connect``) and leave when they close; the group's channel goes with its
last watcher. A socket that joins is held (its samples queued, in order) until it has sent
its backfill, so it never shows a live sample before the history it follows.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial

from channels.layers import get_channel_layer

from core import messages

log = logging.getLogger(__name__)

Send = Callable[[str], Awaitable[None]]


class Watcher:
    """One socket's hold on the groups it watches: samples go to ``send`` once it is ``open()``; an instance's
    status change (``messages.INSTANCE_STATUS``, in a user's group) goes to ``on_status``, if it has one."""

    def __init__(self, send: Send):
        self.send = send
        self.on_status: Callable[[dict], Awaitable[None]] | None = None  # set by a socket that follows its instance
        self.held: list[str] | None = []  # samples that came before the backfill went out; None once open

    def hold(self) -> None:
        """Queue samples again until the next ``open()`` (a new backfill is on its way)."""
        if self.held is None:
            self.held = []

    async def deliver(self, text: str) -> None:
        if self.held is not None:
            self.held.append(text)
            return
        await self.send(text)

    async def open(self) -> None:
        """Send what arrived while the backfill was read, then pass samples straight through."""
        while self.held:
            held, self.held = self.held, []
            for text in held:
                await self.send(text)
        self.held = None


class Fanout:
    """This event loop's groups: for each, the channel that receives it and the sockets watching it."""

    def __init__(self):
        self.layer = get_channel_layer()
        self.watchers: dict[str, dict[Watcher, None]] = {}  # group -> its watchers, in the order they came
        self.readers: dict[str, tuple[asyncio.Future, asyncio.Task]] = {}  # group -> (its channel, its reader)

    async def join(self, group: str, watcher: Watcher) -> None:
        """Watch ``group``; returns once its samples reach this process (a sample after it is not missed)."""
        self.watchers.setdefault(group, {})[watcher] = None
        if group not in self.readers:
            channel = asyncio.get_running_loop().create_future()
            self.readers[group] = (channel, asyncio.create_task(self._read(group, channel)))
        await asyncio.shield(self.readers[group][0])

    async def leave(self, group: str, watcher: Watcher) -> None:
        watching = self.watchers.get(group, {})
        watching.pop(watcher, None)
        if watching or group not in self.readers:
            return
        del self.watchers[group]
        channel, task = self.readers.pop(group)
        task.cancel()
        if channel.done() and not channel.exception():
            await self.layer.group_discard(group, channel.result())

    async def _read(self, group: str, channel: asyncio.Future) -> None:
        try:
            name = await self.layer.new_channel(prefix="monitor.")
            await self.layer.group_add(group, name)
        except Exception as exc:  # Redis away: the sockets joining now fail (and close), the next ones try again
            channel.set_exception(exc)
            self.readers.pop(group, None)
            return
        channel.set_result(name)
        while True:
            try:
                message = await self.layer.receive(name)
            except Exception:  # Redis away for a moment: the layer reconnects; this group's sockets wait for it
                log.exception("monitor samples of %s: receive failed", group)
                await asyncio.sleep(1)
                continue
            if message.get("type") == messages.INSTANCE_STATUS:
                await self._status(group, message)
                continue
            if message.get("type") != messages.TELEMETRY_SAMPLE:
                continue
            text = message["doc"]
            # Each socket's send run here until it waits, not a task each: daphne's send never waits (it fills
            # Twisted's write buffer), and 500 tasks a sample cost the last sockets ~20 ms (bench/ws_viewers.py:
            # p99 1.14-1.32x the bare server against 1.47-1.76x). A send that does wait goes on in a task: no
            # socket's copy waits for another's.
            waiting = []
            for watcher in list(self.watchers.get(group, ())):
                try:
                    if (rest := _run_until_it_waits(watcher.deliver(text))) is not None:
                        waiting.append(rest)
                except Exception:  # one socket gone wrong must not starve the others
                    log.exception("monitor sample to a socket of %s failed", group)
            sent = await asyncio.gather(*waiting, return_exceptions=True)  # the group's next sample waits for them
            for outcome in sent:
                if isinstance(outcome, Exception):
                    log.error("monitor sample to a socket of %s failed", group, exc_info=outcome)

    async def _status(self, group: str, message: dict) -> None:
        watchers = [w for w in self.watchers.get(group, ()) if w.on_status is not None]
        done = await asyncio.gather(*(watcher.on_status(message) for watcher in watchers), return_exceptions=True)
        for outcome in done:
            if isinstance(outcome, Exception):
                log.error("a status change to a monitor socket of %s failed", group, exc_info=outcome)


def _run_until_it_waits(coro: Coroutine) -> asyncio.Task | None:
    """Run ``coro`` in the caller's step until it first waits; None if it ended without waiting, else a task
    running the rest (what Python 3.12's eager tasks do: the images run 3.11). Its exception, if it raises
    before it waits, is the caller's."""
    try:
        waiting = coro.send(None)
    except StopIteration:
        return None
    return asyncio.ensure_future(_Rest(coro, waiting))


class _Rest:
    """The rest of a coroutine that yielded ``waiting`` (what it awaits) to its first driver, to await in a
    task: the task gets ``waiting`` as if the coroutine had yielded it to it, and drives it from there."""

    def __init__(self, coro: Coroutine, waiting):
        self.coro, self.waiting = coro, waiting

    def __await__(self):
        waiting = self.waiting
        while True:
            try:
                yield waiting
            except BaseException as exc:  # the task's cancellation, thrown in where the coroutine waits
                resume = partial(self.coro.throw, exc)
            else:
                resume = partial(self.coro.send, None)
            try:
                waiting = resume()
            except StopIteration as end:
                return end.value


_fanouts: dict[asyncio.AbstractEventLoop, Fanout] = {}


def fanout() -> Fanout:
    """The running event loop's fan-out (one per loop: the channel layer's connections belong to it)."""
    loop = asyncio.get_running_loop()
    if loop not in _fanouts:
        for stale in [x for x in _fanouts if x.is_closed()]:
            del _fanouts[stale]
        _fanouts[loop] = Fanout()
    return _fanouts[loop]
