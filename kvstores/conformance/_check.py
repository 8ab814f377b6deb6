"""The test classes ``kvstores check`` runs: each suite bound to $KVSTORES_CHECK_TARGET.

Every test starts from an empty store: the target's kvstores data is destroyed before
and after each test, so point ``kvstores check`` at a scratch database.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kvstores.conformance.kv import AsyncKeyValueConformance
from kvstores.conformance.targets import TARGET_VARIABLE, is_url, open_target

# The events and fastmcp suites need optional extras; `kvstores check` imports them first
# so that a missing one is reported with the extra to install.
try:
    from kvstores.conformance.events import EventStoreConformance
except ImportError:
    EventStoreConformance = object  # type: ignore[misc,assignment]
try:
    from kvstores.conformance.fastmcp import SessionStateConformance
except ImportError:
    SessionStateConformance = object  # type: ignore[misc,assignment]

_EVENT_LIMIT = 10
_EVENT_TTL = 1.0


async def _emptied(store: Any) -> Any:
    if hasattr(store, "destroy"):
        await store.destroy()
    return store


class _TargetStores:
    """``store`` and ``peer_store`` fixtures opened from the target."""

    @pytest.fixture
    async def store(self) -> AsyncIterator[Any]:
        store = await _emptied(await open_target())
        yield store
        if getattr(store, "closed", False):
            store = await open_target()
        await _emptied(store)
        if hasattr(store, "aclose"):
            await store.aclose()

    @pytest.fixture
    async def peer_store(self, store: Any) -> AsyncIterator[Any]:
        peer = await open_target()
        await store.put("__kvstores_probe__", {"probe": True})
        shared = await peer.get("__kvstores_probe__") is not None
        await store.delete("__kvstores_probe__")
        if not shared:
            if hasattr(peer, "aclose"):
                await peer.aclose()
            pytest.skip("two store objects opened from this target do not share data")
        yield peer
        if hasattr(peer, "aclose"):
            await peer.aclose()


class TestKV(_TargetStores, AsyncKeyValueConformance):
    """The key-value contract against the target."""


class TestFastMCP(_TargetStores, SessionStateConformance):
    """FastMCP session state on the target."""


class TestEvents(EventStoreConformance):
    """The MCP event-store contract: the target's event store, or a StoreEventStore over its store."""

    # The limits are known only when the suite builds the StoreEventStore itself (a URL target).
    max_events_per_stream = max_streams = _EVENT_LIMIT if is_url(os.environ.get(TARGET_VARIABLE, "")) else None
    ttl = _EVENT_TTL if max_streams else None

    @pytest.fixture
    async def event_store(self) -> AsyncIterator[Any]:
        from mcp.server.streamable_http import EventStore

        from kvstores.events import StoreEventStore

        made = await open_target()
        if isinstance(made, EventStore):
            yield made
            return
        store = await _emptied(made)
        yield StoreEventStore(store, max_events_per_stream=_EVENT_LIMIT, max_streams=_EVENT_LIMIT, ttl=_EVENT_TTL)
        await _emptied(store)
        await store.aclose()
