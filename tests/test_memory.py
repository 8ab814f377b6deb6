"""MemoryStore-specific guarantees: the size bound, LRU eviction and reclamation."""

from __future__ import annotations

import asyncio

import pytest

from kvstores.backends.memory import DEFAULT_MAX_ENTRIES, MemoryStore

pytestmark = pytest.mark.anyio


async def test_bounded_with_lru_eviction() -> None:
    store = MemoryStore(max_entries=3)
    await store.put_many(["a", "b", "c"], [{"v": 1}, {"v": 2}, {"v": 3}])
    assert await store.get("a") == {"v": 1}  # a is now the most recently used
    await store.put("d", {"v": 4})
    assert len(store) == 3
    assert await store.get_many(["a", "b", "c", "d"]) == [{"v": 1}, None, {"v": 3}, {"v": 4}]


async def test_expired_entries_are_reclaimed_not_only_hidden() -> None:
    store = MemoryStore(sweep_interval=0)
    await store.put_many([f"k{i}" for i in range(100)], [{"i": i} for i in range(100)], ttl=0.05)
    await store.put("stays", {"v": 1})
    await asyncio.sleep(0.15)
    await store.put("trigger", {"v": 1})
    assert len(store) == 2
    await store.put("short", {"v": 1}, ttl=0.05)
    await asyncio.sleep(0.15)
    await store.cull()
    assert len(store) == 2


async def test_expired_entry_is_removed_when_read() -> None:
    store = MemoryStore()
    await store.put("k", {"v": 1}, ttl=0.05)
    await asyncio.sleep(0.1)
    assert await store.get("k") is None
    assert len(store) == 0


async def test_many_short_ttl_puts_stay_bounded() -> None:
    store = MemoryStore(max_entries=1000, sweep_interval=0.01)
    for round_ in range(20):
        await store.put_many([f"r{round_}-{i}" for i in range(500)], [{"round": round_}] * 500, ttl=0.01)
        assert len(store) <= 1000
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.02)
    await store.cull()
    assert len(store) == 0


def test_default_bound_and_url_options() -> None:
    assert MemoryStore()._cache.maxsize == DEFAULT_MAX_ENTRIES
    store = MemoryStore.from_url("memory://?max_entries=5&sweep_interval=2")
    assert store._cache.maxsize == 5
    with pytest.raises(ValueError):
        MemoryStore(max_entries=0)
