"""Live GPU stats, the control plane's half: the document format and the Redis history the web tier reads.

The GPU host's half (``agent/telemetry/``: the sampler, NVML or simulated cards, cgroups, minute
rollups) builds ``documents``, publishes them to the channel-layer groups ``core.messages`` names and
appends them to ``streams``. Read by the WebSocket server (``portal/sockets/monitor.py``: history from
``streams`` first, then each published document verbatim) and ``/metrics`` (``portal/api/metrics.py``:
the newest document of each node).
"""
