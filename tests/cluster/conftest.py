"""Several GPU hosts for real: ``config/dev/cluster.sh`` brings up the control plane and three hosts
(network namespaces, each with its own Docker engine and node agent) on the tests' own instance of
the address plan, so a developer's ``make cluster`` (gc*, 10.231-10.233) keeps running beside it.

    prefix gct: bridge gctbr0 10.234.0.1/24, host i = netns gcth<i> at 10.234.0.(10+i),
    engine bridge 10.235.<i>.1/24, tenants 10.236.<i>.0/24

Timings are short (heartbeat 1 s, tick and reconciliation every second) as in tests/faults. The
tests drive the platform as a user does, through its HTTP API, and check the outcome where it
lives: each host's Docker engine (its own socket) and the cluster's own PostgreSQL and Redis
(``harness.py``). They run as their own pytest invocation (``-m cluster``; ``make test`` does) and
need root; what is missing fails them, nothing is skipped.
"""

import os
import shutil
import sys
import time

import pytest
from django.conf import settings

from tests.cluster.harness import Cluster, ClusterError

HOSTS = 3
TIMINGS = {
    "NODE_HEARTBEAT_S": "1",
    "NODE_LOST_AFTER_S": "6",
    "SCHEDULER_TICK_S": "1",
    "RECONCILE_S": "1",
    "METER_RECONCILE_S": "2",
    "TRANSITION_DEADLINE_S": "20",
    "INSTANCE_STOP_GRACE_S": "1",
    "PREEMPTION_GRACE_S": "1",
    # An elastic job may grow 5 s after its start; its torchrun rendezvous waits 3 s for more members.
    "SCHEDULER_RESIZE_INTERVAL_S": "5",
    "ELASTIC_LAST_CALL_S": "3",
    # The cluster's database is its own (not pytest's): connections may stay open, so the
    # tests see the agents' connections where they come from.
    "DB_CONN_MAX_AGE": "60",
    "LOG_LEVEL": "INFO",
    "WEB_WORKERS": "2",
    # Each host's data root is btrfs: a system disk of 1 GB is one a test can fill.
    "INSTANCE_SYSTEM_DISK_GB": "1",
}


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "the several-host tests need root (network namespaces, Docker engines)"
    for tool in ("ip", "nsenter", "dockerd", "redis-server", "iptables", "runuser", "curl"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (config/dev/cluster.sh installs what it needs when run as root)"
    return None


@pytest.fixture(scope="session")
def cluster():
    problem = _missing()
    if problem:
        pytest.fail(problem)
    # Another instance of the plan when two runs must not meet (CLUSTER_TEST_PREFIX, CLUSTER_TEST_NET).
    prefix, net = os.environ.get("CLUSTER_TEST_PREFIX", "gct"), int(os.environ.get("CLUSTER_TEST_NET", "234"))
    c = Cluster(prefix=prefix, net=net, directory=settings.VAR_DIR / f"cluster-test-{prefix}", settings=TIMINGS)
    started = time.monotonic()
    try:
        c.up(HOSTS)
        print(f"cluster up in {time.monotonic() - started:.0f}s", file=sys.stderr)
        yield c
    except ClusterError as exc:
        pytest.fail(str(exc))
    finally:
        try:
            c.down()
        except ClusterError as exc:
            pytest.fail(str(exc))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[CALL_FAILED] = report.failed


CALL_FAILED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def nothing_left_running(request, cluster):
    """A test that failed midway may leave its work holding cards: stopped before the next test, which would
    otherwise find the cards it counts on taken (one failure reported as several)."""
    yield
    if request.node.stash.get(CALL_FAILED, False):
        stopped = cluster.stop_everything()
        print(f"after the failure: stopped {', '.join(stopped) or 'nothing'}", file=sys.stderr)


def pytest_collection_modifyitems(items):
    """The session's cluster starts inside its first test's time (cluster.sh up: engines, the images into its
    registry — on a clean checkout the PyTorch image's root filesystem too): minutes on a busy machine, past
    the suite's 180 s. A test that names its own limit keeps it."""
    for item in items:
        if "tests/cluster/" in str(item.path) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(600))
