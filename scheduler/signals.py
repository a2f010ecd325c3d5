"""Lifecycle facts the scheduler announces; portal and billing subscribe.

``workload_changed`` is sent after the transaction that made the change has
committed, with keyword arguments ``workload_id``, ``owner_id``, ``kind``,
``from_status``, ``to_status`` and ``reason``.
"""

from django.dispatch import Signal

workload_changed = Signal()
