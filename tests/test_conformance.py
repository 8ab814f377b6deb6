"""The conformance suite against every backend of the table (tests/support)."""

from __future__ import annotations

import pytest

from kvstores.conformance import AsyncKeyValueConformance, TaskEngineConformance
from tests.support import Backend
from tests.support.fixtures import TableStores


class TestConformance(TableStores, AsyncKeyValueConformance):
    """The suite over the parametrized backend table of tests/support."""

    @pytest.fixture(autouse=True)
    def _fewer_keys_on_a_slow_server(self, backend: Backend) -> None:
        """2,000 keys in one bulk call on SecantusDB (still twenty of MongoDBStore's 100-key chunks): the suite's
        10,000 took up to two minutes there on a loaded machine. A real MongoDB (KVSTORES_MONGODB_URL) runs them all."""
        if backend.slow_server:
            self.large_batch = 2_000


class TestTaskConformance(TableStores, TaskEngineConformance):
    """The background-tasks suite against every row of the backend table."""
