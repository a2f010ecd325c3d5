"""WebSocket routes."""

from django.urls import path

from portal import consumers, log_follow, terminal

websocket_urlpatterns = [
    path("ws/instances/", consumers.InstanceEventsConsumer.as_asgi()),
    path("ws/monitor/instances/<int:instance_id>/", consumers.InstanceMonitorConsumer.as_asgi()),
    path("ws/monitor/nodes/<slug:node>/", consumers.NodeMonitorConsumer.as_asgi()),
    path("ws/monitor/cluster/", consumers.ClusterMonitorConsumer.as_asgi()),
    path("ws/terminal/instances/<int:instance_id>/", terminal.TerminalConsumer.as_asgi()),
    path("ws/logs/jobs/<int:job_id>/", log_follow.JobLogConsumer.as_asgi()),
    path("ws/logs/instances/<int:instance_id>/", log_follow.InstanceLogConsumer.as_asgi()),
    path("ws/terminal/jobs/<int:job_id>/", terminal.JobTerminalConsumer.as_asgi()),
]
