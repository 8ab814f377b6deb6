"""BaseStore: every kvstores backend's public face, composed of one room per concern.

- the protocol (this module): validation, the default collection, get/put/delete/ttl, the
  bulk calls and the optional capabilities (``keys`` ... ``ping``), each passed to the backend's
  primitives with names validated and values encoded;
- the backend's contract (:mod:`kvstores._primitives`): the primitives a backend implements,
  their defaults, and its one place of error translation;
- the life cycle and guards (:mod:`kvstores._store_core`): ``aclose()``, release with the event
  loop, the closed check, tracing once OpenTelemetry is on;
- the capability mixins: atomic operations (:mod:`kvstores._atomic`), values and encryption at
  rest (:mod:`kvstores._encryption`), opportunistic batching (:mod:`kvstores._batching`).

A backend subclasses :class:`BaseStore` and implements the abstract primitives of
:class:`kvstores._primitives.StorePrimitives`; a class missing one cannot be instantiated.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Self, SupportsFloat

from kvstores._atomic import UPDATE_ATTEMPTS, AtomicOperations
from kvstores._batching import Batching
from kvstores._codec import check_collection, check_key, check_keys, check_ttl
from kvstores._encryption import Encryption
from kvstores._primitives import Entry, Stored, by_collection, chunks
from kvstores._sealing import Sealer
from kvstores._signal_host import translated
from kvstores._telemetry import observed
from kvstores._urls import check_user_info, flag, split_url_options

__all__ = [
    "BATCHING_VARIABLE",
    "DEFAULT_COLLECTION",
    "Entry",
    "UPDATE_ATTEMPTS",
    "BaseStore",
    "Stored",
    "by_collection",
    "chunks",
    "translated",
]

DEFAULT_COLLECTION = "default"
"""The collection used when ``collection=None``, unless a store is given another."""

BATCHING_VARIABLE = "KVSTORES_BATCHING"
"""Environment variable that turns batching off (``off``/``false``/``0``) for stores not told otherwise."""


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")


class BaseStore(AtomicOperations, Encryption, Batching):
    """Shared behaviour of every kvstores backend; see :class:`kvstores.AsyncKeyValue`.

    Every BaseStore implements every capability of :mod:`kvstores.protocol`, the atomic
    operations included.
    """

    url_options: ClassVar[Mapping[str, Callable[[str], Any]]] = {}
    """The store's own options in its URL's query, each with its type (``batching`` is every store's)."""

    def __init__(
        self,
        *,
        default_collection: str = DEFAULT_COLLECTION,
        batching: bool | None = None,
        encryption_keys: Sequence[str] | None = None,
    ) -> None:
        """``batching``: coalesce concurrent single-key gets and puts into bulk calls (kvstores._batching);
        None means the backend's :attr:`batching_default`, unless ``KVSTORES_BATCHING`` says off.
        ``encryption_keys``: seal every value at rest under the first key, open those sealed under any
        (kvstores._sealing; the ``encryption`` extra); None stores values as plaintext JSON."""
        check_collection(default_collection)
        self.default_collection = default_collection
        self._sealer = None if encryption_keys is None else Sealer(encryption_keys)
        if batching is None:
            batching = self.batching_default and flag(os.environ.get(BATCHING_VARIABLE, "on"))
        self.batching = batching
        self._trace_if_active()
        self._reads = self._writes = None  # on the instance: the hot path's look-up stops there
        if batching:
            self._start_batching()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Open a store on ``url``: the class's :attr:`url_options` are taken out of its query and
        converted, ``options`` override them, and the rest of the URL goes to :meth:`_from_parsed_url`."""
        check_user_info(url)
        rest, query = split_url_options(url, cls.url_options)
        return cls._from_parsed_url(rest, **{**query, **options})

    @classmethod
    def _from_parsed_url(cls, url: str, **options: Any) -> Self:
        """The store of ``url`` (its store options taken out): by default ``cls(url, **options)``,
        which leaves the rest of the query to the driver; backends that parse a path override it."""
        return cls(url, **options)  # type: ignore[call-arg]  # a backend's constructor takes its URL first

    # -- the protocol ----------------------------------------------------------------

    @observed("key")
    async def get(self, key: str, *, collection: str | None = None) -> dict[str, Any] | None:
        """Return a fresh copy of the value stored under ``key``, or None if absent or expired."""
        name = self._collection(collection)
        check_key(key)
        reads = self._reads
        text = await (self._get(name, key) if reads is None else reads((name, key)))
        return None if text is None else self._decoded(text, name, key)

    @observed("key")
    async def ttl(self, key: str, *, collection: str | None = None) -> tuple[dict[str, Any] | None, float | None]:
        """Return ``(value, remaining seconds)``; the TTL is None when the entry never expires."""
        name = self._collection(collection)
        check_key(key)
        text, remaining = await self._ttl(name, key)
        return (None, None) if text is None else (self._decoded(text, name, key), remaining)

    @observed("key")
    async def put(
        self,
        key: str,
        value: Mapping[str, Any],
        *,
        collection: str | None = None,
        ttl: SupportsFloat | None = None,
    ) -> None:
        """Store ``value`` under ``key``, expiring after ``ttl`` seconds (None: never)."""
        name = self._collection(collection)
        check_key(key)
        seconds = None if ttl is None else check_ttl(ttl)
        text = self._sealed(self._encoded(value), name, key)
        writes = self._writes
        await (self._put(name, key, text, seconds) if writes is None else writes((name, key, text, seconds)))

    @observed("key")
    async def delete(self, key: str, *, collection: str | None = None) -> bool:
        """Delete ``key``; return True if it existed."""
        name = self._collection(collection)
        check_key(key)
        return await self._delete(name, key)

    @observed("keys")
    async def get_many(self, keys: Sequence[str], *, collection: str | None = None) -> list[dict[str, Any] | None]:
        """Return the values of ``keys`` in order, None for each missing key."""
        name = self._collection(collection)
        check_keys(keys)
        if not keys:
            return []
        texts = await self._get_many(name, keys)
        return [None if text is None else self._decoded(text, name, key) for key, text in zip(keys, texts)]

    @observed("keys")
    async def ttl_many(
        self, keys: Sequence[str], *, collection: str | None = None
    ) -> list[tuple[dict[str, Any] | None, float | None]]:
        """Return ``(value, remaining seconds)`` for each key, in order."""
        name = self._collection(collection)
        check_keys(keys)
        if not keys:
            return []
        rows = await self._ttl_many(name, keys)
        return [
            (None, None) if text is None else (self._decoded(text, name, key), remaining)
            for key, (text, remaining) in zip(keys, rows)
        ]

    @observed("keys")
    async def put_many(
        self,
        keys: Sequence[str],
        values: Sequence[Mapping[str, Any]],
        *,
        collection: str | None = None,
        ttl: SupportsFloat | None = None,
    ) -> None:
        """Store each value under its key, all with the same TTL; the last of duplicate keys wins."""
        name = self._collection(collection)
        check_keys(keys)
        if isinstance(values, Mapping) or len(keys) != len(values):
            raise ValueError(f"put_many needs one value per key: got {len(keys)} keys and {len(values)} values")
        seconds = None if ttl is None else check_ttl(ttl)
        texts = [self._encoded(value) for value in values]  # all checked before any is written
        if keys:
            latest = dict(zip(keys, texts))  # duplicate keys: the last value wins
            if self._sealer is not None:
                latest = {key: self._sealed(text, name, key) for key, text in latest.items()}
            await self._put_many(name, list(latest), list(latest.values()), seconds)

    @observed("keys")
    async def delete_many(self, keys: Sequence[str], *, collection: str | None = None) -> int:
        """Delete ``keys``; return how many existed (duplicates count once)."""
        name = self._collection(collection)
        check_keys(keys)
        if not keys:
            return 0
        return await self._delete_many(name, list(dict.fromkeys(keys)))

    # -- capabilities ----------------------------------------------------------------

    @observed("collection")
    async def keys(
        self, collection: str | None = None, *, limit: int | None = None, after: str | None = None
    ) -> list[str]:
        """Return up to ``limit`` live keys of ``collection`` (all when limit is None), in ascending
        code-point order; with ``after``, only the keys that sort after it (a page's last key names
        the next page: bounded queries that page through a collection of any size).
        """
        name = self._collection(collection)
        _check_limit(limit)
        if after is not None:
            check_key(after, "after")
        return [] if limit == 0 else await self._keys(name, limit, after)

    @observed("store")
    async def collections(self, *, limit: int | None = None) -> list[str]:
        """Return up to ``limit`` names of collections that hold live entries."""
        self._check_open()
        _check_limit(limit)
        return [] if limit == 0 else await self._collections(limit)

    @observed("collection")
    async def destroy_collection(self, collection: str) -> bool:
        """Delete every entry of ``collection``; return True if it held any."""
        if collection is None:
            raise TypeError("destroy_collection needs a collection name")
        return await self._destroy_collection(self._collection(collection))

    @observed("store")
    async def destroy(self) -> bool:
        """Delete every entry this store owns (never other data in the database)."""
        self._check_open()
        return await self._destroy()

    @observed("store")
    async def cull(self) -> None:
        """Remove every expired entry from the backend now."""
        self._check_open()
        await self._cull()

    @observed("store")
    async def ping(self) -> None:
        """One cheap round trip to the backend (a readiness check).

        Raises StoreConnectionError, within the store's timeout, when the backend cannot be reached.
        """
        self._check_open()
        await self._ping()
