"""The Celery app as a GPU host runs it: the shared app (``config.celery``) with the host's own tasks.

The node agent's worker (queue ``node.<name>``) and its slow worker (``node.<name>.slow``) load this
module; the control plane loads ``config.celery`` alone and so never imports host code. The tasks are
found as the control plane's are, once Django is set up (``celery -A agent.celery`` imports this before).
"""

from config.celery import app

app.autodiscover_tasks(["agent"])

__all__ = ["app"]
