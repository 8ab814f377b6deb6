"""The store protocol: AsyncKeyValue and the optional capability protocols.

The signatures are exactly those of ``key_value.aio.protocols.AsyncKeyValue`` so a
kvstores store is accepted wherever that protocol is (FastMCP, py-key-value adapters).
Semantics every implementation must keep are in the README and checked by
:mod:`kvstores.conformance`.

What counts as implementing a protocol is decided by :func:`implements`, the same way on every
supported Python: each method of the protocol is found by attribute access, whether the class
defines it or forwards it through ``__getattr__`` (an instrumented or proxying wrapper).
``isinstance()`` against these protocols is not that check: since Python 3.12 it looks members
up statically and does not see ``__getattr__``, so it refuses such wrappers that 3.11 accepted.
"""

from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Generic, Protocol, SupportsFloat, runtime_checkable

__all__ = [
    "CAPABILITIES",
    "AsyncKeyValue",
    "AtomicStore",
    "CullStore",
    "DestroyCollectionStore",
    "DestroyStore",
    "EnumerateCollectionsStore",
    "EnumerateKeysStore",
    "LifecycleStore",
    "UNCHANGED",
    "Unchanged",
    "capabilities",
    "implements",
    "missing_methods",
    "protocol_methods",
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

    async def keys(
        self, collection: str | None = None, *, limit: int | None = None, after: str | None = None
    ) -> list[str]:
        """Return up to ``limit`` live keys of ``collection`` (all when limit is None), in ascending
        code-point order; with ``after``, only those that sort after it (the last key of a page names the next).
        """
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


@runtime_checkable
class LifecycleStore(Protocol):
    """A store its owner can close deterministically (``async with store:`` or ``aclose()``)."""

    async def __aenter__(self) -> Any:
        """Check the store is open and return it."""
        ...

    async def __aexit__(self, *exc_info: object) -> Any:
        """Close the store."""
        ...

    async def aclose(self) -> None:
        """Release the store's resources; closing twice is fine, using it afterwards is not."""
        ...


class Unchanged(enum.Enum):
    """The type of :data:`UNCHANGED` (one member, so that type checkers can tell it apart)."""

    UNCHANGED = "UNCHANGED"
    """What an ``update`` function returns to decline: nothing is written, the TTL is untouched."""


UNCHANGED: Final = Unchanged.UNCHANGED
"""Returned by the function given to :meth:`AtomicStore.update` to decline the change.

The update then writes nothing (the entry and its TTL stay exactly as they were) and returns
the value as it is stored (None when there is no live entry).
"""


@runtime_checkable
class AtomicStore(Protocol):
    """A store with atomic conditional writes, across tasks and processes.

    Expiry is decided inside the atomic step: an expired entry counts as absent and is
    never resurrected. Inputs are validated exactly as for ``put``/``get``.
    """

    async def put_if_absent(
        self,
        key: str,
        value: Mapping[str, Any],
        *,
        collection: str | None = None,
        ttl: SupportsFloat | None = None,
    ) -> bool:
        """Store ``value`` only if ``key`` has no live entry; True when it stored.

        Among any number of concurrent callers exactly one gets True.
        """
        ...

    async def pop(self, key: str, *, collection: str | None = None) -> dict[str, Any] | None:
        """Get and delete ``key`` in one atomic step; None when absent or expired.

        Among concurrent pops of one entry exactly one caller gets the value.
        """
        ...

    async def update(
        self,
        key: str,
        fn: Callable[[dict[str, Any] | None], Mapping[str, Any] | Unchanged | None],
        *,
        collection: str | None = None,
        ttl: SupportsFloat | None = None,
    ) -> dict[str, Any] | None:
        """Atomic read-modify-write: store ``fn(current value or None)`` with ``ttl``, or delete
        the entry when it returns None; return what was stored (None after a delete).

        When ``fn`` returns :data:`UNCHANGED` nothing is written: the entry keeps its value and
        its TTL, and the value as stored (None when absent) is returned.

        ``fn`` may be called more than once under contention, so it must have no side effects;
        if it raises, nothing is written and the exception propagates. No concurrent update is
        lost; past a bounded number of lost races, ConflictError is raised.
        """
        ...


CAPABILITIES: dict[str, type] = {
    "keys": EnumerateKeysStore,
    "collections": EnumerateCollectionsStore,
    "destroy_collection": DestroyCollectionStore,
    "destroy": DestroyStore,
    "cull": CullStore,
    "lifecycle": LifecycleStore,
    "atomic": AtomicStore,
}
"""Each optional capability by name, and the protocol a store implements to have it."""


def capabilities(store: object) -> frozenset[str]:
    """The names of the optional capabilities ``store`` implements (keys of :data:`CAPABILITIES`).

    The one source of truth for what a store can do: the conformance suites and
    ``kvstores check`` derive which groups to run from it. Every :class:`kvstores.BaseStore`
    implements them all.
    """
    return frozenset(name for name, protocol in CAPABILITIES.items() if implements(store, protocol))


@functools.cache
def protocol_methods(protocol: type) -> tuple[str, ...]:
    """The names of the methods ``protocol`` asks for, in the order it declares them."""
    return tuple(
        name
        for base in reversed(protocol.__mro__)
        if base not in (object, Generic, Protocol)
        for name, value in vars(base).items()
        # only what the class body wrote: typing adds __init__ and __subclasshook__ of its own
        if inspect.isfunction(value) and value.__qualname__ == f"{base.__qualname__}.{name}"
    )


def missing_methods(store: object, protocol: type) -> tuple[str, ...]:
    """The methods of ``protocol`` that ``store`` lacks (empty when it implements the protocol).

    A method counts when attribute access finds something callable under its name: on the class
    or through ``__getattr__``. Special methods (``__aenter__``, ``__aexit__``) count only on the
    class, where ``async with`` looks them up.
    """
    return tuple(
        name
        for name in protocol_methods(protocol)
        if not callable(getattr(type(store) if name.startswith("__") else store, name, None))
    )


def implements(store: object, protocol: type) -> bool:
    """True if ``store`` has every method of ``protocol`` (:func:`missing_methods`), on every Python.

    Use it rather than ``isinstance(store, protocol)``, which since Python 3.12 does not see
    methods a wrapper forwards through ``__getattr__``.
    """
    return not missing_methods(store, protocol)
