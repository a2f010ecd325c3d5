"""The Celery app shared by the scheduler worker, beat and node agents."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("gpucloud", task_cls="core.signing:SenderTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
# The control plane's tasks only: a GPU host's (agent/tasks.py) are loaded by the host's own processes
# (agent.celery), so the scheduler worker and beat never import Docker or host code.
app.autodiscover_tasks(["scheduler", "portal", "billing"])


@app.on_after_configure.connect
def _sign_messages(sender, **kwargs):
    """Sign every message and refuse unsigned ones (settings.CELERY_MESSAGE_SIGNING)."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    if not settings.CELERY_MESSAGE_SIGNING:
        return
    for path in (settings.CELERY_SECURITY_KEY, settings.CELERY_SECURITY_CERTIFICATE):
        if not os.path.exists(path):
            raise ImproperlyConfigured(
                f"Celery messages are signed but {path} is missing: run `python manage.py make_signing_keys` "
                "(make run and make test do), or copy the deployment's keys to this host"
            )
    sender.setup_security()
    from core import signing

    signing.register(sender)  # which host signed a message reaches its task
