"""The project's tests take their fixtures from tests/support/fixtures.py (the backend table's).

The quick loop, ``python -m pytest -m "not slow"``, leaves out the modules below: each runs
real processes, servers or load balancers (or waits out timeouts) and they take most of the
suite's time. The README's test command runs everything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.support.fixtures"]

SLOW_MODULES = frozenset(
    {
        "test_atomic",
        "test_bench",
        "test_check",
        "test_cli",
        "test_client_slots",
        "test_compat_slots",
        "test_crash",
        "test_durability",
        "test_events_http",
        "test_exit",
        "test_fastmcp_examples",
        "test_fastmcp_http",
        "test_fastmcp_slots",
        "test_faults",
        "test_multiprocess",
        "test_operator_cli",
        "test_replicas",
        "test_resumption",
        "test_secrets_output",
        "test_sentinel",
        "test_session_borrowing",
        "test_sessions",
        "test_sql_servers",
        "test_subscriptions",
        "test_tls_acl",
    }
)
"""Modules marked ``slow``: child processes, private servers, HAProxy, or fault timeouts."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of a :data:`SLOW_MODULES` module ``slow``."""
    for item in items:
        if Path(str(item.fspath)).stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
