"""The monitor fan-out on the real channel layer: a socket whose send blocks delays no other socket's sample."""

import asyncio
import uuid

from core import messages
from portal.sockets.fanout import Fanout, Watcher


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
