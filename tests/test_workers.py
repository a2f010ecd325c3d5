"""tests/workers.py: what each pytest-xdist worker keeps to itself."""

import pytest

from tests.workers import _worker_environment


def test_each_worker_gets_its_own_redis_db_agent_state_and_shared_storage():
    environ = {"REDIS_URL": "redis://127.0.0.1:6379/15", "TEST_WORKER_REDIS_DBS": "15, 12,11"}
    first, third = _worker_environment("gw0", environ), _worker_environment("gw2", environ)
    assert (first["REDIS_URL"], third["REDIS_URL"]) == ("redis://127.0.0.1:6379/15", "redis://127.0.0.1:6379/11")
    for name in ("AGENT_STATE_DIR", "SHARED_FS_MOUNT", "SHARED_FS_CACHE_DIR", "SHARED_FS_BUCKET"):
        assert first[name] != third[name] and "test-gw2" in third[name]


def test_a_worker_without_a_redis_db_of_its_own_stops_the_run_saying_so():
    with pytest.raises(SystemExit, match="gw3 has no Redis database of its own"):
        _worker_environment("gw3", {"REDIS_URL": "redis://127.0.0.1:6379/15", "TEST_WORKER_REDIS_DBS": "15,12,11"})
