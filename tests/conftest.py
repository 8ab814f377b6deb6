"""The project's tests take their fixtures from tests/support/fixtures.py (the backend table's).

The quick loop, ``python -m pytest -m "not slow"``, leaves out the modules below: each runs
real processes, servers or load balancers (or waits out timeouts) and they take most of the
suite's time. The README's test command runs everything.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.support import BACKENDS, marker

pytest_plugins = ["tests.support.fixtures", "tests.support.leaks"]

SLOW_MODULES = frozenset(
    {
        "test_atomic",
        "test_bench",
        "test_check",
        "test_cli",
        "test_client_slots",
        "test_compat_slots",
        "test_crash",
        "test_dashboard",
        "test_dashboard_browser",
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
        "test_tasks",
        "test_tasks_processes",
        "test_tls_acl",
    }
)
"""Modules marked ``slow``: child processes, private servers, HAProxy, or fault timeouts."""


collect_ignore = [] if importlib.util.find_spec("fastmcp_tasks") else ["test_tasks_fastmcp_client.py"]
"""FastMCP's own task client is fastmcp-tasks', which pins FastMCP 4.1.4 (the main suite runs 4.2, where
tests/test_tasks.py drives the same scenarios on the wire): .ci/compat-matrix's fastmcp-4.1-tasks row runs it."""


LONGEST_FIRST = frozenset({"test_tasks_processes", "test_replicas"})
"""Modules collected first, so that ``--dist loadfile`` starts them first: each runs for minutes on one worker
(its tests one at a time), and started last it would be the run's tail."""


SHARED_SUITES = frozenset(
    {"test_conformance", "test_model", "test_adversarial", "test_multiprocess", "test_atomic", "test_sql_servers"}
)
"""The suites every backend runs; with each backend's own module (``test_<marker>``), marked ``unbatched``."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of a :data:`SLOW_MODULES` module ``slow``, and ``unbatched`` those of the shared
    suites and of each backend's own module (one per marker of the backend table, so a new backend's
    joins by its table row): CI runs them a second time with batching off. :data:`LONGEST_FIRST` go first."""
    unbatched = SHARED_SUITES | {f"test_{marker(name)}" for name in BACKENDS}
    for item in items:
        stem = Path(str(item.fspath)).stem
        if stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        if stem in unbatched:
            item.add_marker(pytest.mark.unbatched)
    items.sort(key=lambda item: Path(str(item.fspath)).stem not in LONGEST_FIRST)  # stable: the rest keep their order
