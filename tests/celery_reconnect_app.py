"""A Celery app of two tasks, for tests/test_celery_consumer.py: a worker holding a message when its broker
restarts. No Django: the broker, the consumer class and a folder come from the environment."""

import os
import time
from pathlib import Path

from celery import Celery

app = Celery("reconnect-test", broker=os.environ["RECONNECT_BROKER_URL"])
app.conf.update(
    worker_consumer=os.environ["RECONNECT_CONSUMER"],
    task_acks_late=True,  # a running task's message stays unacknowledged: what the restart must survive
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    task_default_queue="reconnect",
)
FOLDER = Path(os.environ["RECONNECT_DIR"])


@app.task(name="hold")
def hold(seconds: float) -> None:
    (FOLDER / "holding").touch()
    time.sleep(seconds)


@app.task(name="mark")
def mark(name: str) -> None:
    (FOLDER / name).touch()
