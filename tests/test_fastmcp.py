"""FastMCP session state on every backend of the table, plus the drop-in check."""

from __future__ import annotations

from typing import Any

import pytest
from key_value.aio.protocols import AsyncKeyValue

from kvstores.conformance.fastmcp import SessionStateConformance
from tests.support.fixtures import TableStores


class TestSessionState(TableStores, SessionStateConformance):
    """The session-state suite over the parametrized backend table of tests/support."""


@pytest.mark.anyio
async def test_every_store_is_a_py_key_value_store(store: Any) -> None:
    assert isinstance(store, AsyncKeyValue)
