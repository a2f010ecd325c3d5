"""bench/smoke.py (``make bench-smoke``): every bench has a small-size entry, and what counts as a failure."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def smoke():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_smoke", BENCH / "smoke.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


def test_every_bench_script_has_a_small_size_entry(smoke):
    present, unlisted, _ = smoke.scripts()
    assert "tick_steady.py" in present and "billing_settle.py" in present
    assert unlisted == []


def test_a_script_without_an_entry_is_reported(smoke, monkeypatch):
    monkeypatch.delitem(smoke.SMOKE, "billing_settle.py")
    _, unlisted, _ = smoke.scripts()
    assert unlisted == ["billing_settle.py"]


def line(**fields) -> str:
    return json.dumps(fields)


def test_a_clean_run_passes(smoke):
    out = "\n".join([line(seed=1, errors=0), "some text", line(rps=10, errors=0, commit="abc1234")])
    assert smoke.failure(0, out) is None


def test_it_fails_on_a_non_zero_exit(smoke):
    assert smoke.failure(1, line(errors=0, commit="abc1234")) == "exit status 1"


def test_it_fails_on_errors_on_any_json_line(smoke):
    out = "\n".join([line(seed=1, errors=2), line(rps=10, errors=0, commit="abc1234")])
    assert smoke.failure(0, out) == "errors: 2"


def test_it_fails_without_a_final_line_carrying_errors_and_commit(smoke):
    assert smoke.failure(0, line(rps=10, errors=0)) is not None
    assert smoke.failure(0, line(rps=10, commit="abc1234")) is not None
    assert smoke.failure(0, "no json at all") is not None


def test_exactly_the_benches_that_bring_up_a_cluster_run_in_the_cluster_lane(smoke):
    """The two lanes run side by side: two benches with a cluster at once would meet on its addresses (gcb)."""
    present, _, _ = smoke.scripts()
    bring_up = {s for s in present if "tests.cluster.harness import" in (smoke.BENCH / s).read_text()}
    assert bring_up >= {"cluster_live.py", "gang_allreduce.py", "launch_latency.py"}
    assert {s for s in present if smoke.SMOKE[s].lane == "cluster"} == bring_up
    assert {smoke.SMOKE[s].lane for s in present} == {"cluster", "local"}
