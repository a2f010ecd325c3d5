"""Fractions enforced by the card's MPS daemon: what the agent runs, the limits it sets, what a container sees.

No GPU here: ``nvidia-smi`` and ``nvidia-cuda-mps-control`` are fakes on PATH that write down how they were
called (and, like the real daemon, a pid file and each namespace's socket); the containers are real.
``bench/gpu_check.sh`` checks the same on a real card.
"""

import json
import os
import stat
import tomllib

import pytest
from django.db import transaction

from scheduler.models import WorkloadStatus
from scheduler.node import launcher, mps
from scheduler.node.agent import agent_launch
from scheduler.services.allocation import Share, allocation_create
from scheduler.services.lifecycle import allocations_free
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db

FAKE = """#!/bin/sh
# Writes down its arguments and the MPS environment it was given, as one JSON line.
python3 - "$0" "$@" <<'EOF' >> "{log}"
import json, os, sys
keys = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
argv = [os.path.basename(sys.argv[1])] + sys.argv[2:]
print(json.dumps({{"argv": argv, "env": {{k: os.environ.get(k) for k in keys}}}}))
EOF
{body}
"""
CONTROL_BODY = """
case "$1" in
  -d) [ -n "$MPS_FAKE_FAIL" ] && { echo "$MPS_FAKE_FAIL" >&2; exit 1; }
      for ns in $(sed -n 's/^\\[servers\\.card\\.namespaces\\.\\(.*\\)\\]$/\\1/p' "$5"); do
        mkdir -p "$CUDA_MPS_PIPE_DIRECTORY/card/$ns" && : > "$CUDA_MPS_PIPE_DIRECTORY/card/$ns/control"
      done
      : > "$CUDA_MPS_PIPE_DIRECTORY/control"
      echo $PPID > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid" ;;
  -q) rm -f "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid" ;;
esac
"""


@pytest.fixture
def tools(tmp_path, settings, monkeypatch):
    """Fake NVIDIA tools on PATH; returns a function reading what they were asked to do."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir()
    for name, body in (("nvidia-smi", ""), ("nvidia-cuda-mps-control", CONTROL_BODY)):
        path = bin_dir / name
        path.write_text(FAKE.format(log=log, body=body))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    settings.GPU_SHARE_ENFORCE, settings.MPS_DIR = "mps", str(tmp_path / "mps")
    return lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def node(sim_node):
    """Two RTX 3090s (indexes 0, 1) and an A100 of simulated cards; its containers go afterwards."""
    return sim_node


def launch(user, node, milli, image):
    card = node.gpus.get(index=0)
    w = workload(user, gpu_milli=milli, image_ref=image, memory_mb=256)
    assert allocation_create(
        workload=w, node_id=node.pk, shares=[Share(card.pk, milli, card.memory_mb * milli // 1000)]
    )
    agent_launch(w.pk)
    w.refresh_from_db()
    return w


def run_in(w, command: str) -> str:
    container = launcher.docker_client().containers.get(w.container_name)
    result = container.exec_run(["sh", "-c", command])
    return result.output.decode().strip()


def test_a_fraction_starts_its_cards_daemon_in_exclusive_mode_with_a_limit_per_share(tools, node, user, base_image):
    card = node.gpus.get(index=0)
    w = launch(user, node, 400, base_image)
    assert w.status == WorkloadStatus.RUNNING, w.status_reason

    calls = tools()
    pipe, logs = mps.card_dirs(card.uuid)
    assert [c["argv"] for c in calls] == [
        ["nvidia-smi", "-i", card.uuid, "-c", "EXCLUSIVE_PROCESS"],
        ["nvidia-cuda-mps-control", "-d", "-p", "3", "-a", str(pipe.parent / "mps.toml")],
    ]
    assert calls[1]["env"] == {
        "CUDA_VISIBLE_DEVICES": card.uuid,
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(logs),
    }
    config = tomllib.loads((pipe.parent / "mps.toml").read_text())
    server = config["servers"]["card"]
    assert server["allowed_devices"] == card.uuid
    assert server["namespaces"]["s400"] == {"pinned_memory_limit": "9830M", "active_thread_percentage": "40"}
    assert server["namespaces"]["s100"] == {"pinned_memory_limit": "2457M", "active_thread_percentage": "10"}
    assert len(server["namespaces"]) == 19  # 0.05 ... 0.95


def test_a_container_sees_only_its_namespace_read_only_whatever_its_environment_says(tools, node, user, base_image):
    w = launch(user, node, 400, base_image)
    assert w.status == WorkloadStatus.RUNNING, w.status_reason

    assert run_in(w, "echo $CUDA_MPS_PIPE_DIRECTORY") == "/tmp/nvidia-mps"
    # The namespace's socket alone: not the daemon's control socket (which sets limits), not another share's.
    assert run_in(w, "ls -A /tmp/nvidia-mps") == "control"
    assert "Read-only file system" in run_in(w, "touch /tmp/nvidia-mps/x 2>&1; rm /tmp/nvidia-mps/control 2>&1")
    # Unsetting the variable leads the driver to its default directory: the same socket.
    assert run_in(w, "unset CUDA_MPS_PIPE_DIRECTORY; ls -A ${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}") == "control"
    mount = next(
        m
        for m in launcher.docker_client().containers.get(w.container_name).attrs["Mounts"]
        if m["Destination"] == "/tmp/nvidia-mps"
    )
    assert mount["Source"].endswith("/pipe/card/s400") and mount["RW"] is False


def test_a_second_fraction_on_the_card_reuses_its_daemon(tools, node, user, base_image):
    first, second = launch(user, node, 300, base_image), launch(user, node, 500, base_image)
    assert first.status == second.status == WorkloadStatus.RUNNING
    assert [c["argv"][1] for c in tools() if c["argv"][0] == "nvidia-cuda-mps-control"] == ["-d"]
    assert run_in(second, "ls -A /tmp/nvidia-mps") == "control"
    mounts = launcher.docker_client().containers.get(second.container_name).attrs["Mounts"]
    assert any(m["Source"].endswith("/pipe/card/s500") for m in mounts)


def test_a_whole_card_takes_the_daemon_down_and_the_card_back_to_default_mode(tools, node, user, base_image):
    card = node.gpus.get(index=0)
    fraction = launch(user, node, 500, base_image)
    launcher.container_remove(fraction)
    with transaction.atomic():
        allocations_free(fraction.pk)
    whole = launch(user, node, 1000, base_image)
    assert whole.status == WorkloadStatus.RUNNING, whole.status_reason
    assert [c["argv"] for c in tools()][-2:] == [
        ["nvidia-cuda-mps-control", "-q"],
        ["nvidia-smi", "-i", card.uuid, "-c", "DEFAULT"],
    ]
    assert not mps.daemon_running(card.uuid)
    assert run_in(whole, "ls -A /tmp/nvidia-mps 2>&1; echo ${CUDA_MPS_PIPE_DIRECTORY:-none}").endswith("none")


def test_a_daemon_that_does_not_start_fails_the_launch_naming_the_card(tools, node, user, base_image, monkeypatch):
    monkeypatch.setenv("MPS_FAKE_FAIL", "An MPS control daemon is already running")
    w = launch(user, node, 400, base_image)
    assert w.status == WorkloadStatus.FAILED
    assert node.gpus.get(index=0).uuid in w.status_reason
    assert "already running" in w.status_reason
    assert launcher.containers_on_node(node.name) == {}


def test_simulated_cards_under_auto_run_no_daemon_and_get_no_mount(tools, settings, node, user, base_image):
    settings.GPU_SHARE_ENFORCE = "auto"
    w = launch(user, node, 400, base_image)
    assert w.status == WorkloadStatus.RUNNING, w.status_reason
    assert tools() == []
    assert run_in(w, "echo ${CUDA_MPS_PIPE_DIRECTORY:-none} $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "none 40"


@pytest.mark.parametrize(
    ("milli", "expected"),
    [(400, ("s400", 40, 9830)), (250, ("s250", 25, 6144)), (120, ("s100", 10, 2457)), (1, ("s050", 5, 1228))],
)
def test_a_share_rounds_down_to_its_namespace_the_smallest_being_one_step(milli, expected):
    assert (mps.namespace(milli), *mps.client_limits(milli, 24576)) == expected
