"""WebSocket: a signed-in user's live instance status changes."""

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from portal.receivers import user_group


class InstanceEventsConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.group = user_group(user.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def instance_status(self, event):
        await self.send_json({k: event[k] for k in ("instance", "status", "reason")})
