"""The Celery app shared by the scheduler worker, beat and node agents."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("gpucloud")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# The node agent's tasks live one level down (scheduler/node/tasks.py).
app.autodiscover_tasks(["scheduler.node"])
