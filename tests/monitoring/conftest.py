"""The real-process cluster of the fault tests, for end-to-end monitoring tests."""

from tests.faults.conftest import cluster  # noqa: F401  (a fixture)
