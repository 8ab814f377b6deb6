"""The test classes ``kvstores check`` runs: each suite bound to the target it resolved.

The target comes from the ``check_target`` fixture of ``kvstores check``'s plugin
(:class:`kvstores.conformance._runner.CheckPlugin`). Every test starts from an empty store:
the target's data is destroyed before and after each test (when the store has
``destroy()``), so point ``kvstores check`` at a scratch database.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kvstores.protocol import capabilities
from kvstores.targets import Target, close

_EVENT_LIMIT = 10
_EVENT_TTL = 1.0


async def _emptied(store: Any) -> Any:
    if "destroy" in capabilities(store):
        await store.destroy()
    return store


class _TargetStores:
    """``store`` and ``peer_store`` fixtures opened from the target."""

    @pytest.fixture
    async def store(self, check_target: Target) -> AsyncIterator[Any]:
        store = await _emptied(await check_target.open())
        yield store
        if getattr(store, "closed", False):
            store = await check_target.open()
        await _emptied(store)
        await close(store)

    @pytest.fixture
    async def peer_store(self, check_target: Target, store: Any) -> AsyncIterator[Any]:
        peer = await check_target.open()
        await store.put("__kvstores_probe__", {"probe": True})
        shared = await peer.get("__kvstores_probe__") is not None
        await store.delete("__kvstores_probe__")
        if not shared:
            await close(peer)
            pytest.skip("two store objects opened from this target do not share data")
        yield peer
        await close(peer)


def _suite(module: str, name: str) -> Any:
    """The suite class, or a plain base when its extra is missing (kvstores check tells the user first)."""
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError:
        return object


class TestKV(_TargetStores, _suite("kvstores.conformance.kv", "AsyncKeyValueConformance")):  # type: ignore[misc]
    """The key-value contract against the target."""


class TestFastMCP(_TargetStores, _suite("kvstores.conformance.fastmcp", "SessionStateConformance")):  # type: ignore[misc]
    """FastMCP session state on the target."""


class TestTasks(_TargetStores, _suite("kvstores.conformance.tasks", "TaskEngineConformance")):  # type: ignore[misc]
    """Background tasks kept on the target."""


class TestEvents(_suite("kvstores.conformance.events", "EventStoreConformance")):  # type: ignore[misc]
    """The MCP event-store contract on a StoreEventStore over the target's store (whose limits are known)."""

    max_events_per_stream = max_streams = _EVENT_LIMIT
    ttl = _EVENT_TTL

    @pytest.fixture
    async def event_store(self, check_target: Target) -> AsyncIterator[Any]:
        from kvstores.events import StoreEventStore

        store = await _emptied(await check_target.open())
        yield StoreEventStore(store, max_events_per_stream=_EVENT_LIMIT, max_streams=_EVENT_LIMIT, ttl=_EVENT_TTL)
        await _emptied(store)
        await close(store)


class TestEventStore(_suite("kvstores.conformance.events", "EventStoreConformance")):  # type: ignore[misc]
    """The MCP event-store contract on the event store the target makes (its limits are not known)."""

    @pytest.fixture
    async def event_store(self, check_target: Target) -> AsyncIterator[Any]:
        yield await check_target.open()
