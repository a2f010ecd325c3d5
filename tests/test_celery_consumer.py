"""A worker holding a message when Redis restarts goes on consuming (config/celery_consumer.py).

A real Redis of the test's own and a real Celery worker (threads, as the scheduler and the agents run):
a task is running (its message unacknowledged, acks_late) and the consumer waits on Redis for the next
one when Redis is stopped and started again. Celery's own consumer (5.7.0) dies of it every time; the
workers' consumer reconnects and runs the next task.
"""

import secrets
import shutil
import signal
import subprocess
import sys

import pytest
from celery import Celery
from django.conf import settings

from tests.conftest import wait_for
from tests.faults.conftest import _listening
from tests.ports import free_port

OURS = "config.celery_consumer:Consumer"
CELERYS = "celery.worker.consumer:Consumer"


class Broker:
    def __init__(self, tmp_path):
        self.port, self.password = free_port(), secrets.token_hex(8)
        self.url = f"redis://:{self.password}@127.0.0.1:{self.port}/0"
        self.log = tmp_path / "redis.log"
        self.process = None

    def start(self):
        command = [shutil.which("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        command += ["--appendonly", "no", "--requirepass", self.password]
        self.process = subprocess.Popen(command, stdout=open(self.log, "a"), stderr=subprocess.STDOUT)  # noqa: SIM115
        wait_for(lambda: _listening(self.port), timeout=10, what="redis")

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(30)


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path)
    b.start()
    yield b
    if b.process.poll() is None:
        b.stop()


def worker(broker, tmp_path, consumer):
    env = {"RECONNECT_BROKER_URL": broker.url, "RECONNECT_CONSUMER": consumer, "RECONNECT_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "celery", "-A", "tests.celery_reconnect_app", "worker", "-Q", "reconnect"]
    command += ["--pool", "threads", "--concurrency", "2", "--without-gossip", "--without-mingle", "-l", "INFO"]
    log = tmp_path / "worker.log"
    process = subprocess.Popen(
        command,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)} | env,
        cwd=settings.BASE_DIR,
        stdout=open(log, "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    return process, log


def restart_while_holding(broker, tmp_path, consumer):
    """The worker, after Redis restarted under it while it ran a task and waited for the next."""
    client = Celery("sender", broker=broker.url)
    client.conf.task_default_queue = "reconnect"
    process, log = worker(broker, tmp_path, consumer)
    try:
        client.send_task("hold", args=[60])
        wait_for(lambda: (tmp_path / "holding").exists(), timeout=60, what="the worker to run the held task")
        broker.stop()
        wait_for(lambda: "Connection to broker lost" in log.read_text(), timeout=30, what="the worker to notice")
        broker.start()
        return process, log, client
    except BaseException:
        process.kill()
        raise


def test_a_worker_holding_a_message_survives_a_redis_restart_and_goes_on_consuming(broker, tmp_path):
    process, log, client = restart_while_holding(broker, tmp_path, OURS)
    try:
        client.send_task("mark", args=["after"])
        wait_for(lambda: (tmp_path / "after").exists(), timeout=60, what="the worker to run a task sent after")
        assert process.poll() is None, log.read_text()[-3000:]
        assert "Unrecoverable error" not in log.read_text()
    finally:
        process.kill()
        process.wait(10)


def test_celerys_own_consumer_dies_of_it(broker, tmp_path):
    """Why ours exists: when this fails, Celery fixed it, and config/celery_consumer.py can go."""
    process, log, _ = restart_while_holding(broker, tmp_path, CELERYS)
    try:
        # It stops (after the task it runs: a warm shutdown), saying why.
        crash = "Unrecoverable error: AttributeError(\"'NoneType' object has no attribute 'hostname'\")"
        wait_for(lambda: crash in log.read_text(), timeout=60, what="Celery's consumer to give up")
    finally:
        process.kill()
        process.wait(10)
