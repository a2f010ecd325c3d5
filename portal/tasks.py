"""Portal's Celery tasks (scheduler queue): idle auto-stop and housekeeping of long-stopped instances."""

from celery import shared_task

from portal import housekeeping


@shared_task(ignore_result=True)
def idle_stop():
    housekeeping.idle_stop()


@shared_task(ignore_result=True)
def release_long_stopped():
    housekeeping.housekeeping()
