"""WebSocket routes."""

from django.urls import path

from portal.sockets import logs, monitor, terminal

websocket_urlpatterns = [
    path("ws/instances/", monitor.InstanceEventsConsumer.as_asgi()),
    path("ws/monitor/instances/<int:instance_id>/", monitor.InstanceMonitorConsumer.as_asgi()),
    path("ws/monitor/nodes/<slug:node>/", monitor.NodeMonitorConsumer.as_asgi()),
    path("ws/monitor/cluster/", monitor.ClusterMonitorConsumer.as_asgi()),
    path("ws/terminal/instances/<int:instance_id>/", terminal.TerminalConsumer.as_asgi()),
    path("ws/logs/jobs/<int:job_id>/", logs.JobLogConsumer.as_asgi()),
    path("ws/logs/instances/<int:instance_id>/", logs.InstanceLogConsumer.as_asgi()),
    path("ws/terminal/jobs/<int:job_id>/", terminal.JobTerminalConsumer.as_asgi()),
]
