"""Staff powers over other people's work and teams: permissions that only staff accounts hold (being staff gives
none of them; the groups Support, Operators and Billing hold them, portal migration 0012; superusers hold all).

The work's are ``scheduler.Workload``'s (its Meta), the teams' Django's own on ``billing.Team``. Their use over
work that is not the user's own is recorded (``portal.models.AuditEntry``).
"""

VIEW_ANY_WORK = "scheduler.view_any_work"  # support: every user's instances, jobs and arrays, to look at
OPERATE_ANY_WORK = "scheduler.operate_any_work"  # operators: also act on them
READ_WORK_ENV = "scheduler.view_work_env"  # another's job environment (API keys live there), when asked
VIEW_ANY_TEAM = "billing.view_team"  # billing: any team
RUN_ANY_TEAM = "billing.change_team"  # and its members and limits, as its admins would


def holds(user, power: str) -> bool:
    """Whether ``user`` holds ``power``: only staff accounts do (so a plain user's check costs no query), given it
    directly, by a group, or as a superuser."""
    return user.is_staff and user.has_perm(power)
