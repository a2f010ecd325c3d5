"""Browser tests: Playwright driving Debian's Chromium (no browser download is possible here).

They run as their own pytest invocation (``make test`` does both) with
DJANGO_ALLOW_ASYNC_UNSAFE=true: Playwright's sync API keeps an event loop in
the test thread, which Django would otherwise take for async code.
"""

import shutil

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="session")
def browser_type_launch_args():
    return {
        "executable_path": CHROMIUM,
        "args": [
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ],
    }


from tests.faults.conftest import cluster  # noqa: E402, F401  (a fixture: the real-process cluster)


# The browser tests run beside the several-host tests (make test's last stage): there a container's launch on this
# machine's engine once took past the fault tests' 8 s (8 Dec, the monitor's test: "its launch did not finish
# within 8 s"). These tests are of pages, not of deadlines: a launch counts as failed after 30 s.
@pytest.fixture
def cluster_env() -> dict:
    return {"TRANSITION_DEADLINE_S": "30"}
