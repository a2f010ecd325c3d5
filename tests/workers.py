"""What each of pytest-xdist's workers (``make test`` runs the main suite on several: it is mostly waiting on
engines, workers and timeouts) must not share with the others, set before Django reads its settings.

Loaded with ``-p tests.workers`` (pyproject.toml), before pytest-django configures Django. On a worker
(``PYTEST_XDIST_WORKER=gw<N>``) it gives that worker

- a Redis database of its own: the N-th of ``TEST_WORKER_REDIS_DBS`` (comma-separated; ``make test`` names
  them), so Celery queues, channel groups and the tick's wake-ups never cross;
- an agent state directory and a shared-storage mount, cache and bucket of its own under ``var/test-gw<N>``.

The test database is pytest-django's own per worker (``test_<name>_gw<N>``), and every session already has its
own ``DEPLOYMENT_ID`` (tests/conftest.py), which labels and names every container, volume and MPS daemon.
Outside xdist nothing changes.
"""

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _worker_environment(worker: str, environ: dict) -> dict:
    """The variables worker ``gw<N>`` runs under (a pure function of its name and the environment)."""
    index = int(worker.removeprefix("gw"))
    databases = [d for d in environ.get("TEST_WORKER_REDIS_DBS", "").split(",") if d.strip()]
    if index >= len(databases):
        raise SystemExit(
            f"pytest-xdist worker {worker} has no Redis database of its own: TEST_WORKER_REDIS_DBS names "
            f"{len(databases)} ({environ.get('TEST_WORKER_REDIS_DBS', '')!r}); name one per worker, or run fewer (-n)"
        )
    redis_url = environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    own = ROOT / "var" / f"test-{worker}"
    return {
        "REDIS_URL": re.sub(r"/\d+$", "", redis_url) + f"/{databases[index].strip()}",
        "AGENT_STATE_DIR": str(own / "agent"),
        "SHARED_FS_MOUNT": str(own / "sharedfs" / "mnt"),
        "SHARED_FS_CACHE_DIR": str(own / "sharedfs" / "cache"),
        "SHARED_FS_BUCKET": str(own / "sharedfs" / "data") + "/",
    }


if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.update(_worker_environment(os.environ["PYTEST_XDIST_WORKER"], os.environ))
