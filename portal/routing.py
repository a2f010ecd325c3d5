"""WebSocket routes."""

from django.urls import path

from portal.consumers import InstanceEventsConsumer

websocket_urlpatterns = [path("ws/instances/", InstanceEventsConsumer.as_asgi())]
