from tests.fakes.nvidia import fake_nvidia  # noqa: F401  (the fixture, for the tests here)
