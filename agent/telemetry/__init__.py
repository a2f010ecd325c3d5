"""The GPU host's half of live monitoring: read the cards and containers, publish, fold into minutes.

``sampler`` (a thread of the node agent) reads the node's running work, its containers' CPU and memory
(``cgroups``) and its cards through a backend (``nvml`` on a GPU server, ``simgpu`` elsewhere), builds the
documents (``scheduler.telemetry.documents``), publishes them to the channel-layer groups ``core.messages``
names, appends them to the Redis history (``scheduler.telemetry.streams``) and folds them into minute
``rollups``. The web tier reads only the control plane's half.
"""
