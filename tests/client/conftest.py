"""The real ``gpucloud`` command (a subprocess) against a real server: daphne on TCP, a Celery worker with a
node agent and its relay, Docker, PostgreSQL and Redis."""

import os
import subprocess
import sys

import pytest

from portal.services.tokens import token_create


class Cli:
    def __init__(self, url: str, token: str, config_home: str):
        self.url, self.token, self.config_home = url, token, config_home

    def __call__(self, *args: str, input: str | None = None, timeout: float = 120, signed_in: bool = True, **env):
        environment = {k: v for k, v in os.environ.items() if not k.startswith("GPUCLOUD_")}
        environment |= {"XDG_CONFIG_HOME": self.config_home, "COLUMNS": "200", "NO_COLOR": "1"}
        if signed_in:
            environment |= {"GPUCLOUD_URL": self.url, "GPUCLOUD_TOKEN": self.token}
        environment |= env
        return subprocess.run(
            [sys.executable, "-m", "gpucloud", *args],
            input=input,
            capture_output=True,
            text=True,
            env=environment,
            timeout=timeout,
            stdin=None if input is not None else subprocess.DEVNULL,
        )


@pytest.fixture
def cli(user, web_server, tmp_path):
    """``cli(*args)``: run gpucloud as ``user`` (GPUCLOUD_URL / GPUCLOUD_TOKEN) with its own config folder."""
    _, key = token_create(user=user, name="cli tests")
    return Cli(f"http://{web_server}", key, str(tmp_path / "config"))


@pytest.fixture
def agent(node_worker, settings, tmp_path):
    """The node agent's parts the CLI reaches: its worker, its relay and — where this tree has it — its log
    collector (``agent.collector``, from the logs branch of issue 16), as the agent runs them."""
    try:
        from agent import collector
    except ImportError:  # before the logs branch is merged: the CLI follows the job's status instead
        yield node_worker
        return
    from agent.launcher import docker_client

    settings.WORKLOG_DIR = tmp_path / "worklogs"
    running = collector.Collector(node_worker.name, docker_client().api).start()
    yield node_worker
    running.stop()
