"""WebSockets: a user's instance status changes, and live GPU stats for those who may see them.

Monitor sockets first send ``{"type": "history", "samples": [...]}`` (a compact
backfill from Redis — points over the last 15 minutes cut to what the charts draw,
then the newest sample whole: ``streams.backfill_read`` — so a chart draws at once
on open and on reconnect), then each new sample document as it is published. They refuse
with a close code: 4401 not signed in, 4403 not staff, 4404 no such instance
of yours. The terminal and log sockets refuse with the same codes and ``refuse``.
"""

import asyncio
import logging

import redis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer

from core import messages
from portal import selectors
from portal.sockets.fanout import Watcher, fanout
from scheduler.models import Node, Workload
from scheduler.telemetry import streams

log = logging.getLogger(__name__)
NOT_SIGNED_IN, NOT_STAFF, NOT_FOUND = 4401, 4403, 4404


async def refuse(consumer, code: int) -> None:
    """Accept, then close with ``code``: a close before the handshake reaches a browser as a bare 403."""
    await consumer.accept()
    await consumer.close(code=code)


class InstanceEventsConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await refuse(self, NOT_SIGNED_IN)
            return
        self.group = messages.user_group(user.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def instance_status(self, event):
        await self.send_json({k: event[k] for k in ("instance", "status", "reason")})


class MonitorConsumer(AsyncWebsocketConsumer):
    """Watches the groups ``subscriptions`` names, sends their backfill, then relays samples verbatim.

    Samples come through this process's fan-out (``fanout.py``: one channel-layer receive
    per document, whatever the number of viewers), not through a channel of each socket's.
    """

    staff_only = False
    channel_layer_alias = None  # no channel of its own: get_channel_layer(None) is None
    groups_joined: list[str]

    async def connect(self):
        self.groups_joined = []
        self.watcher = Watcher(self.send_sample)
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await refuse(self, NOT_SIGNED_IN)
            return
        if self.staff_only and not user.is_staff:
            await refuse(self, NOT_STAFF)
            return
        subscriptions = await database_sync_to_async(self.subscriptions)(user)
        if subscriptions is None:
            await refuse(self, NOT_FOUND)
            return
        groups, backfill = subscriptions
        for group in groups:  # joined before the backfill is read: a sample in between is sent twice, not lost
            await self.join(group)
        await self.accept()
        await self.send_history(backfill)
        await self.watcher.open()
        await self.connected()

    async def join(self, group: str) -> None:
        self.groups_joined.append(group)
        await fanout().join(group, self.watcher)

    async def leave(self, group: str) -> None:
        self.groups_joined.remove(group)
        await fanout().leave(group, self.watcher)

    async def send_history(self, backfill) -> None:
        try:
            samples = await asyncio.to_thread(backfill)  # Redis only: no need to queue for the database thread
        except redis.RedisError as exc:  # the chart starts empty and fills live: no reason to drop the socket
            log.warning("monitor backfill unreadable: %s", exc)
            samples = []
        await self.send(text_data='{"type":"history","samples":[' + ",".join(samples) + "]}")

    async def connected(self) -> None:
        """After the backfill went out and samples flow (a subclass's hook)."""

    def subscriptions(self, user):
        """(groups to join, a function reading their backfill), or None to refuse."""
        raise NotImplementedError

    async def disconnect(self, code):
        for group in list(self.groups_joined):
            await self.leave(group)

    async def send_sample(self, text: str) -> None:
        await self.send(text_data=text)


class InstanceMonitorConsumer(MonitorConsumer):
    """One instance's GPUs and container: its owner (and whoever sees everyone's work: core.powers.VIEW_ANY_WORK).

    Its samples come from the host it is on, in that host's group and stream (``messages.workload_group``: named by
    host, so a host's Redis user writes into no other host's work's charts). The socket also watches the owner's
    status changes, which only the control plane publishes: when one is this instance's, it looks where the
    instance is now and, if that is another host (placed after waiting, moved, requeued, stopped), watches that
    host's group instead and sends its history (the page adds what is newer than what it drew).
    """

    def subscriptions(self, user):
        instances = selectors.instance_list(user=user, include_released=True)
        found = instances.filter(pk=self.scope["url_route"]["kwargs"]["instance_id"]).values_list(
            "pk", "owner_id", "workload_id", "workload__node__name"
        )
        found = found.first()
        if found is None:
            return None
        self.instance_id, owner_id, self.workload_id, self.node = found
        self.placement = asyncio.Lock()
        self.closed = False
        self.watcher.on_status = self.status_changed
        return [messages.user_group(owner_id), *self._groups(self.node)], self._backfill(self.node)

    def _groups(self, node: str | None) -> list[str]:
        return [messages.workload_group(node, self.workload_id)] if node else []

    def _backfill(self, node: str | None):
        if not node:
            return list
        return lambda: streams.backfill_read(streams.workload_stream(node, self.workload_id))

    def _node_now(self) -> str | None:
        return Workload.objects.filter(pk=self.workload_id).values_list("node__name", flat=True).first()

    async def connected(self) -> None:
        await self.follow()  # a move between the look above and joining the owner's group is not missed

    async def status_changed(self, event: dict) -> None:
        if event.get("instance") == self.instance_id:
            await self.follow()

    async def follow(self) -> None:
        """Watch the host the instance is on now (no host: nothing), with that host's history first."""
        async with self.placement:
            node = await database_sync_to_async(self._node_now)()
            if self.closed or node == self.node:
                return
            old, self.node = self.node, node
            self.watcher.hold()
            for group in self._groups(old):
                await self.leave(group)
            for group in self._groups(node):
                await self.join(group)
            await self.send_history(self._backfill(node))
            await self.watcher.open()

    async def disconnect(self, code):
        if hasattr(self, "placement"):
            async with self.placement:
                self.closed = True
                await super().disconnect(code)
        else:
            await super().disconnect(code)


class NodeMonitorConsumer(MonitorConsumer):
    """One node's cards at full rate: staff."""

    staff_only = True

    def subscriptions(self, user):
        name = self.scope["url_route"]["kwargs"]["node"]
        if not Node.objects.filter(name=name).exists():
            return None
        return [messages.node_group(name)], lambda: streams.backfill_read(streams.node_stream(name))


class ClusterMonitorConsumer(MonitorConsumer):
    """Every node's cards (the latest sample of each as history): staff."""

    staff_only = True

    def subscriptions(self, user):
        names = list(Node.objects.order_by("name").values_list("name", flat=True))
        return [messages.node_group(n) for n in names], lambda: [
            text for n in names for text in streams.history_read(streams.node_stream(n), count=1)
        ]
