"""The store protocol: AsyncKeyValue and the optional capability protocols.

The signatures are exactly those of ``key_value.aio.protocols.AsyncKeyValue`` so a
kvstores store is accepted wherever that protocol is (FastMCP, py-key-value adapters).
Semantics every implementation must keep are in the README and checked by
:mod:`kvstores.conformance`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, SupportsFloat, runtime_checkable

__all__ = [
    "AsyncKeyValue",
    "CullStore",
    "DestroyCollectionStore",
    "DestroyStore",
    "EnumerateCollectionsStore",
    "EnumerateKeysStore",
]


@runtime_checkable
class AsyncKeyValue(Protocol):
    """Async get/put/delete/ttl of JSON-object values by (collection, key), single and bulk."""

    async def get(self, key: str, *, collection: str | None = None) -> dict[str, Any] | None:
        """Return a fresh copy of the value stored under ``key``, or None if absent or expired."""
        ...

    async def ttl(self, key: str, *, collection: str | None = None) -> tuple[dict[str, Any] | None, float | None]:
        """Return ``(value, remaining seconds)``; the TTL is None when the entry never expires."""
        ...

    async def put(
        self,
        key: str,
        value: Mapping[str, Any],
        *,
        collection: str | None = None,
        ttl: SupportsFloat | None = None,
    ) -> None:
        """Store ``value`` under ``key``, expiring after ``ttl`` seconds (None: never)."""
        ...

    async def delete(self, key: str, *, collection: str | None = None) -> bool:
        """Delete ``key``; return True if it existed."""
        ...

    async def get_many(self, keys: Sequence[str], *, collection: str | None = None) -> list[dict[str, Any] | None]:
        """Return the values of ``keys`` in order, None for each missing key."""
        ...

    async def ttl_many(
        self, keys: Sequence[str], *, collection: str | None = None
    ) -> list[tuple[dict[str, Any] | None, float | None]]:
        """Return ``(value, remaining seconds)`` for each key, in order."""
        ...

    async def put_many(
        self,
        keys: Sequence[str],
        values: Sequence[Mapping[str, Any]],
        *,
        collection: str | None = None,
        ttl: SupportsFloat | None = None,
    ) -> None:
        """Store each value under its key, all with the same TTL; the last of duplicate keys wins."""
        ...

    async def delete_many(self, keys: Sequence[str], *, collection: str | None = None) -> int:
        """Delete ``keys``; return how many existed."""
        ...


@runtime_checkable
class CullStore(Protocol):
    """A store that can reclaim expired entries on demand."""

    async def cull(self) -> None:
        """Remove every expired entry from the backend."""
        ...


@runtime_checkable
class EnumerateKeysStore(Protocol):
    """A store that can list the keys of a collection."""

    async def keys(self, collection: str | None = None, *, limit: int | None = None) -> list[str]:
        """Return up to ``limit`` live keys of ``collection`` (all when limit is None)."""
        ...


@runtime_checkable
class EnumerateCollectionsStore(Protocol):
    """A store that can list its collections."""

    async def collections(self, *, limit: int | None = None) -> list[str]:
        """Return up to ``limit`` names of collections that hold live entries."""
        ...


@runtime_checkable
class DestroyCollectionStore(Protocol):
    """A store that can delete a whole collection."""

    async def destroy_collection(self, collection: str) -> bool:
        """Delete every entry of ``collection``; return True if it held any."""
        ...


@runtime_checkable
class DestroyStore(Protocol):
    """A store that can delete all of its own data."""

    async def destroy(self) -> bool:
        """Delete every entry this store owns (never other data in the database)."""
        ...
