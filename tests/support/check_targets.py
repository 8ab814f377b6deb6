"""Factories ``kvstores check`` is pointed at by tests/test_check.py (as ``tests.support.check_targets:NAME``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, SupportsFloat

from kvstores import MemoryStore


def py_key_value_memory_store() -> Any:
    """py-key-value's MemoryStore: a real store written by others, with known defects."""
    from key_value.aio.stores.memory import MemoryStore as ForeignMemoryStore

    return ForeignMemoryStore()


class CoreOnly:
    """A store with the core protocol only (no keys(), cull(), aclose(), atomic operations...)."""

    def __init__(self) -> None:
        self._store = MemoryStore()

    async def get(self, key: str, *, collection: str | None = None) -> dict[str, Any] | None:
        return await self._store.get(key, collection=collection)

    async def ttl(self, key: str, *, collection: str | None = None) -> tuple[dict[str, Any] | None, float | None]:
        return await self._store.ttl(key, collection=collection)

    async def put(
        self, key: str, value: Mapping[str, Any], *, collection: str | None = None, ttl: SupportsFloat | None = None
    ) -> None:
        await self._store.put(key, value, collection=collection, ttl=ttl)

    async def delete(self, key: str, *, collection: str | None = None) -> bool:
        return await self._store.delete(key, collection=collection)

    async def get_many(self, keys: Sequence[str], *, collection: str | None = None) -> list[dict[str, Any] | None]:
        return await self._store.get_many(keys, collection=collection)

    async def ttl_many(
        self, keys: Sequence[str], *, collection: str | None = None
    ) -> list[tuple[dict[str, Any] | None, float | None]]:
        return await self._store.ttl_many(keys, collection=collection)

    async def put_many(
        self,
        keys: Sequence[str],
        values: Sequence[Mapping[str, Any]],
        *,
        collection: str | None = None,
        ttl: SupportsFloat | None = None,
    ) -> None:
        await self._store.put_many(keys, values, collection=collection, ttl=ttl)

    async def delete_many(self, keys: Sequence[str], *, collection: str | None = None) -> int:
        return await self._store.delete_many(keys, collection=collection)


def core_only() -> CoreOnly:
    """A fresh :class:`CoreOnly` store."""
    return CoreOnly()


def raising() -> Any:
    """A factory that fails."""
    raise RuntimeError("no database configured")


def not_a_store() -> Any:
    """A factory that returns something else."""
    return {"get": "not a store"}
