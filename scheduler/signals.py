"""Lifecycle facts the scheduler announces; portal and billing subscribe.

``workload_changed`` is sent after the transaction that made the change has
committed, with keyword arguments ``workload_id``, ``owner_id``, ``kind``, ``group_id``
(its array's group, or None), ``from_status``, ``to_status``, ``reason`` and ``at`` (the time of the event row that
records the change). Receivers are called with ``send_robust``: each runs whatever
the others do, so one must not rely on another.
"""

from django.dispatch import Signal

workload_changed = Signal()

# A running workload's meter paused or resumed (``MeterChange``) with no change of status, after commit: keyword
# arguments ``workload_id``, ``change`` and ``at`` (the time of the event row that records it).
workload_metering = Signal()
