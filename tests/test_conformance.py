"""The conformance suite against every backend of the table (tests/support)."""

from __future__ import annotations

from kvstores.conformance import AsyncKeyValueConformance
from tests.support import TableStores


class TestConformance(TableStores, AsyncKeyValueConformance):
    """The suite over the parametrized backend table of tests/conftest.py."""
