"""The conformance suite against every backend of the table (tests/support)."""

from __future__ import annotations

from typing import Any

import pytest

from kvstores.conformance import AsyncKeyValueConformance


class TestConformance(AsyncKeyValueConformance):
    """The suite over the parametrized backend table of tests/conftest.py."""

    @pytest.fixture
    def store(self, backend_store: Any) -> Any:
        return backend_store

    @pytest.fixture
    def peer_store(self, backend_peer_store: Any) -> Any:
        return backend_peer_store
