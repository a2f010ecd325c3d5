"""Everything that runs on a GPU host, under the host's own database role and keys.

The node agent (``management/commands/node_agent.py``) serves its queue ``node.<name>`` (``tasks`` ->
``actions``), launches containers (``launcher``: the Docker SDK; ``mps`` for fractions of a card,
``hostview``, ``diskio``, ``disks``), converges with the database (``reconcile``), fences its tenants'
network (``network``, ``iptables``) and itself when cut off (``selffence``), follows logs (``collector``
-> ``worklogs``), serves terminal and files (``relay/``), samples its cards (``telemetry/``) and mounts
the shared storage (``sharedfs``). The control plane (``scheduler``, ``portal``, ``billing``) never
imports this package: it talks to a host only through the messages in ``core.messages``.
"""
