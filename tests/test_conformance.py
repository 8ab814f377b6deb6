"""The conformance suite against every backend of the table (tests/support)."""

from __future__ import annotations

from kvstores.conformance import AsyncKeyValueConformance, TaskEngineConformance
from tests.support.fixtures import TableStores


class TestConformance(TableStores, AsyncKeyValueConformance):
    """The suite over the parametrized backend table of tests/support."""


class TestTaskConformance(TableStores, TaskEngineConformance):
    """The background-tasks suite against every row of the backend table."""
