"""The rules config/dev/run_smoke.py checks `make run`'s stack by: the charge it expects and the token it signs in
with. The ports it takes are tests/ports.py's (tests/test_ports.py)."""

import importlib.util
from decimal import Decimal
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "config" / "dev" / "run_smoke.py"
spec = importlib.util.spec_from_file_location("run_smoke", PATH)
run_smoke = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_smoke)


def test_a_run_shorter_than_a_minute_is_expected_to_cost_a_minute():
    assert run_smoke.expected_charge(Decimal("3.34"), 20) == run_smoke.expected_charge(Decimal("3.34"), 60)
    assert run_smoke.expected_charge(Decimal("3.34"), 20) == Decimal("0.06")  # 3.34 / 60 = 0.0557


def test_seconds_past_the_minute_are_expected_per_second_rounded_half_up_once():
    assert run_smoke.expected_charge(Decimal("3.34"), 600) == Decimal("0.56")  # 0.5567
    assert run_smoke.expected_charge(Decimal("0.90"), 70) == Decimal("0.02")  # 0.0175, half up


def test_each_charge_line_adds_half_a_cent_of_rounding_to_what_is_tolerated():
    assert run_smoke.charge_tolerance(1) == Decimal("0.015")
    assert run_smoke.charge_tolerance(2) == Decimal("0.02")


def test_it_signs_in_with_the_token_load_demo_printed_for_demo_not_the_admins():
    printed = "user demo / demo-pass-123  API token demo-key\nuser admin / admin-pass-123  API token admin-key\n"
    assert run_smoke.demo_token(printed) == "demo-key"
    with pytest.raises(run_smoke.StepFailed):
        run_smoke.demo_token("user admin / admin-pass-123  API token admin-key\n")
