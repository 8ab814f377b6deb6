"""The test classes ``kvstores check`` runs: each suite bound to $KVSTORES_CHECK_TARGET.

Every test starts from an empty store: the target's kvstores data is destroyed before
and after each test, so point ``kvstores check`` at a scratch database.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from kvstores.conformance.kv import AsyncKeyValueConformance
from kvstores.conformance.targets import open_target


async def _emptied(store: Any) -> Any:
    if hasattr(store, "destroy"):
        await store.destroy()
    return store


class TestKV(AsyncKeyValueConformance):
    """The key-value contract against the target."""

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
