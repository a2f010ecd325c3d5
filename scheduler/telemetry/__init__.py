"""Live GPU stats, from the card to the browser: one wing, read top to bottom.

Runs on each GPU host, in a thread of the node agent:
- ``sampler``: every ``TELEMETRY_INTERVAL_S`` reads the node's running work, its
  containers' CPU and memory (``cgroups``) and its cards through a backend
  (``nvml`` on a GPU server, ``simgpu`` elsewhere), builds the documents
  (``documents``: the versioned shape the README documents), publishes them to
  the channel-layer groups ``config.messages`` names, appends them to
  ``streams`` (the Redis history) and folds them into minute ``rollups``
  (``GpuMinute``, ``WorkloadGpuMinute``: what idle auto-stop and the
  scheduler's idle weighting read).

Read by the WebSocket server (``portal/sockets/monitor.py``: history from ``streams``
first, then each published document verbatim) and ``/metrics``
(``portal/api/metrics.py``: the newest document of each node).
"""
