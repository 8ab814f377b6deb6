"""BaseStore: validation, the default collection, lifecycle, atomic updates and single-key fallbacks.

A backend subclasses :class:`BaseStore` and implements its abstract primitives: the bulk
primitives (``_get_many``, ``_ttl_many``, ``_put_many``, ``_delete_many``), the capability
primitives (``_keys`` ... ``_cull``) and the atomic primitives (``_swap``, ``_pop``); a
class missing one cannot be instantiated. Primitives receive names that are already
validated and values that are already encoded JSON text (what :meth:`BaseStore._encoded`
returns, sealed when the store has encryption keys; MemoryStore's own override keeps some as
marshal bytes), so a backend never validates or encodes anything itself. The single-key
primitives default to a bulk call of one key; backends override them when a single-key
command is cheaper.

Lifecycle: a backend that opens a connection bound to the event loop (a thread, a pool)
calls :meth:`BaseStore._release_with_loop` once it has; if nobody closes the store, the
connection is then released as the loop shuts down (``asyncio.run``'s end, uvicorn's
shutdown), so the process exits at once and silently, and the store reconnects on a later
loop. ``aclose()`` is final: queued calls fail with StoreClosedError, a backend's open path
checks :meth:`BaseStore._check_open` under its opening lock, so nothing reopens.

``update()`` is optimistic and lives here once for every backend: it reads the stored text,
runs the caller's function with no lock held, then ``_swap``s in the result only if the
stored text is still the one it read (compared by the backend, atomically); a lost race
retries after a jittered backoff, at most :data:`UPDATE_ATTEMPTS` times, then raises
ConflictError.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import os
import random
import warnings
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Self, SupportsFloat, TypeVar

from kvstores import _telemetry
from kvstores._batching import Coalescer
from kvstores._codec import (
    MAX_VALUE_BYTES,
    check_collection,
    check_key,
    check_keys,
    check_ttl,
    decode_value,
    encode_value,
)
from kvstores._sealing import Sealer, is_sealed, sealed_key_id
from kvstores._signal_host import translated
from kvstores._telemetry import observed
from kvstores._urls import check_user_info, flag, split_url_options
from kvstores.errors import (
    ConflictError,
    DeserializationError,
    EncryptionKeyError,
    KVStoreError,
    StoreClosedError,
    ValueTooLargeError,
)
from kvstores.loop import release_with_loop
from kvstores.protocol import UNCHANGED, Unchanged

if TYPE_CHECKING:
    from kvstores._signal_host import OwnedChannel, Sink, Transport

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

T = TypeVar("T")

Stored = str | bytes
"""What a backend's read primitives return: the encoded JSON text, as str or UTF-8 bytes
(MemoryStore's: marshal bytes too, which only its own ``_decoded`` reads)."""

DEFAULT_COLLECTION = "default"
"""The collection used when ``collection=None``, unless a store is given another."""

BATCHING_VARIABLE = "KVSTORES_BATCHING"
"""Environment variable that turns batching off (``off``/``false``/``0``) for stores not told otherwise."""

UPDATE_ATTEMPTS = 100
"""Races ``update()`` may lose before it raises ConflictError (with backoff, about 2.5 s at most)."""

_BACKOFF_BASE = 0.001
_BACKOFF_CAP = 0.025


Entry = tuple[str, str, str, "float | None"]
"""One put of a batch, as a backend's ``_put_entries`` receives it: (collection, key, encoded value, ttl)."""


def _entry_size(entry: Entry) -> int:
    return len(entry[2])


def by_collection(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """The keys of (collection, key) ``pairs`` by collection, in the order they come."""
    keys_by_collection: dict[str, list[str]] = {}
    for collection, key in pairs:
        keys_by_collection.setdefault(collection, []).append(key)
    return keys_by_collection


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


_PRIMITIVES = frozenset(
    (
        "_get",
        "_ttl",
        "_put",
        "_delete",
        "_get_many",
        "_ttl_many",
        "_put_many",
        "_delete_many",
        "_get_pairs",
        "_put_entries",
        "_keys",
        "_collections",
        "_destroy_collection",
        "_destroy",
        "_cull",
        "_swap",
        "_pop",
        "_ping",
        "_close",
    )
)
"""The methods a backend may define that talk to the backend: each is wrapped by :func:`_translating`."""


def _translating(primitive: Callable[..., Any]) -> Callable[..., Any]:
    """``primitive`` with the driver's exceptions translated by its store's ``_translate``.

    A call that fails because the store was closed under it raises StoreClosedError (but
    ``_close`` itself, which runs once the store is marked closed, keeps its own error).
    """
    closing = primitive.__name__ == "_close"

    @functools.wraps(primitive)
    async def translated(self: BaseStore, *args: Any) -> Any:
        try:
            return await primitive(self, *args)
        except KVStoreError:
            raise
        except Exception as exc:
            error = self._translate(exc)
            if error is None:
                raise
            if self._closed and not closing:  # the store was closed under the call
                raise self._closed_error() from exc
            raise error from exc

    return translated


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")


class BaseStore(abc.ABC):
    """Shared behaviour of every kvstores backend; see :class:`kvstores.AsyncKeyValue`.

    Every BaseStore implements every capability of :mod:`kvstores.protocol`, the atomic
    operations included.
    """

    _closed = False
    _telemetry_decided = False
    _loop_guard: AsyncGenerator[None, None] | None = None
    _signal_channel: OwnedChannel | None = None  # made by kvstores.signals.channel(); the store's aclose() closes it

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Wrap the backend's primitives in its error translation, once, as the class is made."""
        super().__init_subclass__(**kwargs)
        if cls._translate is not BaseStore._translate:
            for name in _PRIMITIVES & cls.__dict__.keys():
                setattr(cls, name, _translating(cls.__dict__[name]))

    db_system: ClassVar[str]
    """The backend's ``db.system.name`` in telemetry (``redis``, ``sqlite``...): every backend declares it."""

    url_options: ClassVar[Mapping[str, Callable[[str], Any]]] = {}
    """The store's own options in its URL's query, each with its type (``batching`` is every store's)."""

    batching_default: ClassVar[bool] = True
    """Whether the backend coalesces concurrent calls unless told otherwise (kvstores._batching)."""

    connections: int = 10
    """How many calls the backend carries at once (its pool's size; 10 is asyncpg's and asyncmy's
    default pool): with more than one, a batch of coalesced calls flies beside the call in flight
    instead of waiting for it (kvstores._batching). Backends set it from their pool options."""

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
        self._reads: Coalescer[tuple[str, str], Stored | None] | None = None
        self._writes: Coalescer[Entry, None] | None = None
        if batching:
            system = self.db_system
            self._reads = Coalescer(
                self._get_pair,
                self._read_batch,
                capacity=lambda: self.connections,
                on_batch=lambda size: _telemetry.record_batch(system, "get", size),
            )
            self._writes = Coalescer(
                self._put_entry,
                self._write_batch,
                size=_entry_size,
                key=lambda entry: entry[:2],  # puts of one (collection, key) keep their order
                capacity=lambda: self.connections,
                on_batch=lambda size: _telemetry.record_batch(system, "put", size),
            )

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

    @functools.cached_property
    def _observer(self) -> _telemetry.Observer:
        """Traces and measures this store's calls (made on first use, once OpenTelemetry is active)."""
        attributes: dict[str, Any] = {"db.system.name": self.db_system}
        try:
            server = self._server_address()
        except ValueError:  # a URL only its driver reads (several hosts): no single address to name
            server = None
        if server is not None:
            attributes["server.address"], attributes["server.port"] = server
        return _telemetry.Observer(attributes)

    # -- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> BaseStore:
        """Check the store is open and return it."""
        self._check_open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close the store."""
        await self.aclose()

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        """Warn, as aiosqlite and asyncio transports do, when a store holding a connection is never closed."""
        try:
            unclosed = not self._closed and self._holds_connection()
        except AttributeError:  # __init__ raised before the store was complete: nothing to release
            return
        if unclosed:
            _warn(f"unclosed {type(self).__name__}: close it with aclose() or async with", ResourceWarning, source=self)

    async def aclose(self) -> None:
        """Release the store's resources; closing twice is fine, using it afterwards is not.

        Calls still queued for a batch fail with StoreClosedError; a call already in flight
        completes or fails; nothing reconnects afterwards.
        """
        if self._closed:
            return
        self._closed = True  # first: a transport's reader stops even where a cancellation was swallowed
        channel, self._signal_channel = self._signal_channel, None
        if channel is not None:  # its reader and tasks end now, on this loop, before the connections go
            await channel.aclose()
        for coalescer in (self._reads, self._writes):
            if coalescer is not None:
                coalescer.close(self._closed_error)
        guard, self._loop_guard = self._loop_guard, None
        if guard is not None:
            await guard.aclose()
        await self._close()

    async def _release_with_loop(self) -> None:
        """Have the running event loop release this store's connection as it shuts down.

        A backend calls this when it has opened a connection bound to the running loop. Once
        per loop: a store used again on a later loop reconnects and calls it again.
        """
        self._loop_guard = await release_with_loop(self._release_unless_closed)

    async def _release_unless_closed(self) -> None:
        if not self._closed:  # aclose() releases, and finalizes the guard
            await self._close()

    async def close(self) -> None:
        """The same as ``aclose()``: py-key-value's stores are closed with ``close()``."""
        await self.aclose()

    @property
    def closed(self) -> bool:
        """True once ``aclose()`` has been called."""
        return self._closed

    def _closed_error(self) -> StoreClosedError:
        return StoreClosedError(f"{type(self).__name__} is closed")

    def _check_open(self) -> None:
        """Raise StoreClosedError once the store is closed (backends call it before (re)connecting).

        Every call of the protocol passes here first. Whether a store's calls are traced
        (:mod:`kvstores._telemetry`) is decided once: when it is made, if an SDK is installed by
        then, else at its first call, for the calls after it.
        """
        if self._closed:
            raise self._closed_error()
        if not self._telemetry_decided:
            self._telemetry_decided = True
            self._trace_if_active()

    def _trace_if_active(self) -> None:
        """Bind traced versions of the protocol's methods on this store if an SDK is installed."""
        if _telemetry.active():
            self._telemetry_decided = True
            for name in _OBSERVED:
                setattr(self, name, _telemetry.traced(self, getattr(type(self), name), lambda: self._observer))

    def trace_calls(self, on: bool = True) -> None:
        """Decide again whether this store's calls are traced (kvstores._telemetry).

        ``on``: traced from now on if an OpenTelemetry SDK is installed, as a store made after it
        is; otherwise back to the plain methods. A store decides by itself once, when it is made or
        at its first call; this is for a store already in use when an SDK comes or goes (the
        benchmark's with- and without-SDK rows, kvstores.bench._otel).
        """
        if on:
            self._trace_if_active()
        else:
            for name in _OBSERVED:
                self.__dict__.pop(name, None)

    def _collection(self, collection: str | None) -> str:
        """The validated name of ``collection`` (the default for None); raise if the store is closed."""
        if self._closed or not self._telemetry_decided:
            self._check_open()
        if collection is None:
            return self.default_collection
        check_collection(collection)
        return collection

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
    async def keys(self, collection: str | None = None, *, limit: int | None = None) -> list[str]:
        """Return up to ``limit`` live keys of ``collection`` (all when limit is None)."""
        name = self._collection(collection)
        _check_limit(limit)
        return [] if limit == 0 else await self._keys(name, limit)

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

    # -- atomic operations (kvstores.AtomicStore) ------------------------------------

    @observed("key")
    async def put_if_absent(
        self,
        key: str,
        value: Mapping[str, Any],
        *,
        collection: str | None = None,
        ttl: SupportsFloat | None = None,
    ) -> bool:
        """Store ``value`` only if ``key`` has no live entry; True when it stored (one round trip)."""
        name = self._collection(collection)
        check_key(key)
        seconds = None if ttl is None else check_ttl(ttl)
        return await self._swap(name, key, None, self._sealed(self._encoded(value), name, key), seconds)

    @observed("key")
    async def pop(self, key: str, *, collection: str | None = None) -> dict[str, Any] | None:
        """Get and delete ``key`` in one atomic step (one round trip); None when absent or expired."""
        name = self._collection(collection)
        check_key(key)
        text = await self._pop(name, key)
        return None if text is None else self._decoded(text, name, key)

    @observed("key")
    async def update(
        self,
        key: str,
        fn: Callable[[dict[str, Any] | None], Mapping[str, Any] | Unchanged | None],
        *,
        collection: str | None = None,
        ttl: SupportsFloat | None = None,
    ) -> dict[str, Any] | None:
        """Atomically store ``fn(current value or None)`` with ``ttl``, or delete when it returns None.

        Returns what was stored (None after a delete). When ``fn`` returns :data:`UNCHANGED`
        nothing is written (the TTL is untouched) and the value ``fn`` was given is returned: one
        round trip. Two round trips when uncontended; ``fn`` runs with no lock held and may run again
        after a lost race, so it must have no side effects. Raises ConflictError after
        :data:`UPDATE_ATTEMPTS` lost races.
        """
        name = self._collection(collection)
        check_key(key)
        seconds = None if ttl is None else check_ttl(ttl)
        for attempt in range(UPDATE_ATTEMPTS):
            stored = await self._get(name, key)
            old = None if stored is None else self._decoded(stored, name, key)
            new = fn(old)
            if new is UNCHANGED:
                return old
            if new is None and stored is None:
                return None  # nothing to delete: the entry was absent when read
            text = None if new is None else self._encoded(new)
            if await self._swap(name, key, stored, None if text is None else self._sealed(text, name, key), seconds):
                return None if text is None else self._decoded(text, name, key)  # read back from before sealing
            await asyncio.sleep(random.uniform(0, min(_BACKOFF_CAP, _BACKOFF_BASE * 2**attempt)))
        raise ConflictError(f"update of key {key!r} lost {UPDATE_ATTEMPTS} races to concurrent writers; giving up")

    # -- encryption at rest (kvstores._sealing) -----------------------------------------

    def _encoded(self, value: Mapping[str, Any]) -> str:
        """``value`` validated and encoded as the backend keeps it: its JSON text.

        Through :meth:`_sealed`, it is what the primitives (``_put``, ``_put_many``, ``_swap``) are handed.
        """
        return encode_value(value)

    def _sealed(self, text: str, collection: str, key: str) -> str:
        """``text`` as the backend stores it: sealed when the store has encryption keys."""
        if self._sealer is None:
            return text
        sealed = self._sealer.seal(text, collection, key)
        if len(sealed) > MAX_VALUE_BYTES:
            raise ValueTooLargeError(
                f"cannot serialize value: sealed, it takes {len(sealed)} bytes; the limit is {MAX_VALUE_BYTES}"
            )
        return sealed

    def _decoded(self, stored: Stored, collection: str, key: str) -> dict[str, Any]:
        """The value of ``stored`` (opened first when sealed); EncryptionKeyError when it cannot be opened."""
        if self._sealer is not None:
            return decode_value(self._sealer.open(stored, collection, key), key)
        try:
            return decode_value(stored, key)
        except DeserializationError:
            if not is_sealed(stored):  # looked at only when the text is not JSON: free on every good read
                raise
        raise EncryptionKeyError(
            f"stored value for key {key[:100]!r} is sealed with key id {sealed_key_id(stored)!r}; "
            f"this store has no encryption keys"
        )

    @property
    def encryption_key_ids(self) -> tuple[str, ...]:
        """The ids of the store's encryption keys, the one that seals first; empty without encryption.

        Ids only (8 characters derived from each key, as sealed values name them), never the keys.
        """
        return () if self._sealer is None else self._sealer.key_ids

    async def reseal(self, key: str, *, collection: str | None = None) -> bool:
        """Seal ``key``'s entry under the first encryption key, keeping its TTL; True when rewritten.

        False when the entry is absent, expired or sealed under that key already. A compare-and-set
        against the text read: a write that lands meanwhile is never overwritten (the entry is read
        again). EncryptionKeyError when it cannot be opened, ValueError on a store without encryption
        keys. ``kvstores rekey`` calls it for every entry (kvstores._rekey).
        """
        name = self._collection(collection)
        check_key(key)
        return await self._reseal(name, key)

    async def _reseal(self, collection: str, key: str) -> bool:
        sealer = self._sealer
        if sealer is None:
            raise ValueError("re-sealing needs a store opened with encryption_keys")
        for _ in range(UPDATE_ATTEMPTS):
            stored, remaining = await self._ttl(collection, key)
            if stored is None or not sealer.needs_resealing(stored):
                return False
            opened = sealer.open(stored, collection, key)
            text = opened if isinstance(opened, str) else opened.decode("utf-8")
            decode_value(text, key)  # stored plaintext that is not a value is reported, not sealed
            if await self._swap(collection, key, stored, self._sealed(text, collection, key), remaining):
                return True
        raise ConflictError(f"re-sealing key {key!r} lost {UPDATE_ATTEMPTS} races to concurrent writers; giving up")

    # -- primitives: names validated, values encoded ---------------------------------

    @abc.abstractmethod
    async def _get_many(self, collection: str, keys: Sequence[str]) -> Sequence[Stored | None]:
        raise NotImplementedError

    @abc.abstractmethod
    async def _ttl_many(self, collection: str, keys: Sequence[str]) -> Sequence[tuple[Stored | None, float | None]]:
        raise NotImplementedError

    @abc.abstractmethod
    async def _put_many(self, collection: str, keys: Sequence[str], texts: list[str], ttl: float | None) -> None:
        """Write distinct ``keys`` with their encoded values, all or nothing where possible."""
        raise NotImplementedError

    @abc.abstractmethod
    async def _delete_many(self, collection: str, keys: Sequence[str]) -> int:
        """Delete distinct ``keys``; return how many existed."""
        raise NotImplementedError

    @abc.abstractmethod
    async def _keys(self, collection: str, limit: int | None) -> list[str]:
        raise NotImplementedError

    @abc.abstractmethod
    async def _collections(self, limit: int | None) -> list[str]:
        raise NotImplementedError

    @abc.abstractmethod
    async def _destroy_collection(self, collection: str) -> bool:
        raise NotImplementedError

    @abc.abstractmethod
    async def _destroy(self) -> bool:
        raise NotImplementedError

    @abc.abstractmethod
    async def _cull(self) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    async def _swap(
        self, collection: str, key: str, expected: Stored | None, text: str | None, ttl: float | None
    ) -> bool:
        """Atomically replace the live entry's stored text ``expected`` (None: no live entry) with
        ``text`` (None: delete it) expiring after ``ttl``; return False, changing nothing, when
        the stored text is no longer ``expected``. An expired entry counts as absent."""
        raise NotImplementedError

    @abc.abstractmethod
    async def _pop(self, collection: str, key: str) -> Stored | None:
        """Delete the entry and return its stored text, in one atomic step; None if absent or expired."""
        raise NotImplementedError

    def _translate(self, exc: Exception) -> KVStoreError | None:
        """The kvstores error to raise for ``exc``, which one of this store's primitives raised.

        The one place a backend translates its driver's exceptions: StoreConnectionError when
        the backend cannot be reached or timed out, KVStoreError for any other driver error, None
        to let ``exc`` through (a bug, not the driver's). The base applies it around every
        primitive (:data:`_PRIMITIVES`), with the driver's exception as ``__cause__``; a store
        with nothing to translate (memory) keeps the default and pays nothing.
        """
        return None

    def _signal_transport(self, sink: Sink) -> Transport[Any] | None:
        """The transport of this store's signal channel (:mod:`kvstores.signals`), made for ``sink``.

        None (the default): the backend has none, and a channel on it raises TypeError. A
        backend returns its :class:`kvstores.signals.Transport` (importing its module here, so
        that a store that never signals never imports it), handing it what it needs as
        arguments; the transport imports no backend (:mod:`kvstores._signal_host`).
        """
        return None

    async def _close(self) -> None:  # noqa: B027 - optional hook: most backends have something to release
        """Release backend resources (called once, by ``aclose``)."""

    async def _ping(self) -> None:
        """One cheap round trip; by default the read of a key that kvstores never writes."""
        await self._get(self.default_collection, "\x00kvstores-ping")

    def _server_address(self) -> tuple[str, int] | None:
        """The (host, port) of the server this store talks to, for telemetry; None without one."""
        return None

    def _holds_connection(self) -> bool:
        """True while the store holds a connection that only ``aclose()`` releases."""
        return False

    async def _get(self, collection: str, key: str) -> Stored | None:
        return (await self._get_many(collection, [key]))[0]

    # -- batching: what the coalescers run ------------------------------------------

    async def _get_pair(self, pair: tuple[str, str]) -> Stored | None:
        return await self._get(*pair)

    async def _read_batch(self, pairs: Sequence[tuple[str, str]]) -> list[Stored | None]:
        """The stored texts of a batch of gets: each distinct (collection, key) pair read once."""
        distinct = list(dict.fromkeys(pairs))
        found = dict(zip(distinct, await self._get_pairs(distinct)))
        return [found[pair] for pair in pairs]

    async def _put_entry(self, entry: Entry) -> None:
        await self._put(*entry)

    async def _write_batch(self, entries: Sequence[Entry]) -> list[None]:
        """Write a batch of puts: of several puts of one key, the last queued wins, whatever its TTL."""
        latest = {(collection, key): (collection, key, text, ttl) for collection, key, text, ttl in entries}
        await self._put_entries(list(latest.values()))
        return [None] * len(entries)

    async def _get_pairs(self, pairs: Sequence[tuple[str, str]]) -> Sequence[Stored | None]:
        """The stored text of each distinct (collection, key) pair, whatever their collections.

        Backends override it to read every collection in one round trip; this default reads
        the collections concurrently, one ``_get_many`` each.
        """
        keys_by_collection = by_collection(pairs)
        found: dict[tuple[str, str], Stored | None] = {}
        replies = await asyncio.gather(*(self._get_many(c, keys) for c, keys in keys_by_collection.items()))
        for (collection, keys), texts in zip(keys_by_collection.items(), replies):
            found.update(zip(((collection, key) for key in keys), texts))
        return [found[pair] for pair in pairs]

    async def _put_entries(self, entries: Sequence[Entry]) -> None:
        """Write entries of distinct (collection, key) pairs, each with its own TTL.

        Backends override it to write every collection in one round trip; this default writes
        each (collection, TTL) group concurrently with one ``_put_many``.
        """
        groups: dict[tuple[str, float | None], tuple[list[str], list[str]]] = {}
        for collection, key, text, ttl in entries:
            keys, texts = groups.setdefault((collection, ttl), ([], []))
            keys.append(key)
            texts.append(text)
        await asyncio.gather(*(self._put_many(c, keys, texts, ttl) for (c, ttl), (keys, texts) in groups.items()))

    async def _ttl(self, collection: str, key: str) -> tuple[Stored | None, float | None]:
        return (await self._ttl_many(collection, [key]))[0]

    async def _put(self, collection: str, key: str, text: str, ttl: float | None) -> None:
        await self._put_many(collection, [key], [text], ttl)

    async def _delete(self, collection: str, key: str) -> bool:
        return await self._delete_many(collection, [key]) > 0


_OBSERVED = tuple(name for name, method in vars(BaseStore).items() if hasattr(method, _telemetry.SHAPE))
"""The names of the public methods a traced store wraps (those marked by ``observed``)."""
