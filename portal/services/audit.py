"""The record of powers used over other people's work (``AuditEntry``): who did what to whose work, and when.

An operator's stop, support's read of a job's environment, a team admin's cancel: each is written by the service
that does it, in the same transaction, whenever the one acting is not the work's owner; and staff who change a
team they are not an admin of (``team_power_used``). The owner's own actions are their history (the work's events),
not an audit.
"""

from portal.models import AuditEntry


def power_used(*, by, owner_id: int, action: str, target: str) -> None:
    """Record that ``by`` did ``action`` to ``target`` (``"instance 12"``), owned by ``owner_id``: if not theirs."""
    if by is not None and by.pk != owner_id:
        AuditEntry.objects.create(actor=by, owner_id=owner_id, action=action[:32], target=target[:64])


def team_power_used(*, by, team: str, action: str, target: str) -> None:
    """Record that ``by``, not one of its admins, did ``action`` to ``target`` (``"member alice"``) of ``team``."""
    AuditEntry.objects.create(actor=by, team=team[:64], action=action[:32], target=target[:64])
