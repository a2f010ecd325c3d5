"""The monitor fan-out on the real channel layer: a socket whose send blocks delays no other socket's sample."""

import asyncio
import uuid

import pytest

from core import messages
from portal.sockets.fanout import Fanout, Watcher, _run_until_it_waits


def test_a_socket_whose_send_blocks_does_not_hold_back_the_others_copy_of_the_sample():
    async def scenario():
        fanout = Fanout()
        group = f"monitor-test-{uuid.uuid4().hex[:8]}"
        unblocked = asyncio.Event()
        received = asyncio.Queue()

        async def blocked_send(text):
            await received.put(("blocked", text))
            await unblocked.wait()  # a socket whose peer reads nothing

        async def quick_send(text):
            await received.put(("quick", text))

        blocked, quick = Watcher(blocked_send), Watcher(quick_send)
        for watcher in (blocked, quick):  # the blocked one first: it is served first
            await fanout.join(group, watcher)
            await watcher.open()
        try:
            await fanout.layer.group_send(group, {"type": messages.TELEMETRY_SAMPLE, "doc": "sample 1"})
            while_blocked = {await asyncio.wait_for(received.get(), 10) for _ in range(2)}
            unblocked.set()
            await fanout.layer.group_send(group, {"type": messages.TELEMETRY_SAMPLE, "doc": "sample 2"})
            after = {await asyncio.wait_for(received.get(), 10) for _ in range(2)}
        finally:
            for watcher in (blocked, quick):
                await fanout.leave(group, watcher)
            await fanout.layer.flush()  # its connections belong to this loop, which ends here
        return while_blocked, after

    while_blocked, after = asyncio.run(scenario())
    assert while_blocked == {("blocked", "sample 1"), ("quick", "sample 1")}
    assert after == {("blocked", "sample 2"), ("quick", "sample 2")}


def test_a_send_runs_in_the_fanouts_step_until_it_waits_then_in_a_task_that_ends_as_it_would():
    async def scenario():
        trace = []
        gate = asyncio.get_running_loop().create_future()

        async def send(waits: bool, fails: bool = False):
            trace.append("began")
            try:
                if waits:
                    trace.append(await gate)
                if fails:
                    raise ValueError("peer gone")
                return "sent"
            finally:
                trace.append("ended")

        assert _run_until_it_waits(send(waits=False)) is None
        assert trace == ["began", "ended"]  # ran to its end in this step, no task
        trace.clear()
        rest = _run_until_it_waits(send(waits=True))
        assert trace == ["began"] and not rest.done()
        gate.set_result("opened")
        assert await rest == "sent" and trace == ["began", "opened", "ended"]

        gate = asyncio.get_running_loop().create_future()
        failing = _run_until_it_waits(send(waits=True, fails=True))
        gate.set_result("opened")
        with pytest.raises(ValueError, match="peer gone"):
            await failing

        gate = asyncio.get_running_loop().create_future()
        trace.clear()
        cancelled = _run_until_it_waits(send(waits=True))
        await asyncio.sleep(0)  # the task waits on the gate now
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert trace == ["began", "ended"] and gate.cancelled()  # the cancellation reached the send's own wait

    asyncio.run(scenario())
