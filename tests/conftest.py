"""The project's tests take their fixtures from tests/support/fixtures.py (the backend table's)."""

pytest_plugins = ["tests.support.fixtures"]
