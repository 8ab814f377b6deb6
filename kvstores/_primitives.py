"""What a backend implements: the primitives of :class:`kvstores.BaseStore`, their defaults and error translation.

A backend implements the abstract primitives of :class:`StorePrimitives`: the bulk primitives
(``_get_many``, ``_ttl_many``, ``_put_many``, ``_delete_many``), the capability primitives
(``_keys`` ... ``_cull``) and the atomic primitives (``_swap``, ``_pop``); a class missing one
cannot be instantiated. Primitives receive names that are already validated and values that
are already encoded JSON text (sealed when the store has encryption keys; MemoryStore keeps
some as marshal bytes), so a backend never validates or encodes anything itself. The
single-key primitives default to a bulk call of one key, and the cross-collection batch
primitives (``_get_pairs``, ``_put_entries``) to one bulk call per collection; backends
override them when their own commands are cheaper.

Every primitive a backend defines runs inside the backend's :meth:`StorePrimitives._translate`,
the one place its driver's exceptions become kvstores errors.
"""

from __future__ import annotations

import abc
import asyncio
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from kvstores.errors import KVStoreError, StoreClosedError

if TYPE_CHECKING:
    from kvstores._signal_host import Sink, Transport

__all__ = ["Entry", "StorePrimitives", "Stored", "by_collection", "chunks"]

T = TypeVar("T")

Stored = str | bytes
"""What a backend's read primitives return: the encoded JSON text, as str or UTF-8 bytes
(MemoryStore's: marshal bytes too, which only its own ``_decoded`` reads)."""

Entry = tuple[str, str, str, "float | None"]
"""One put of a batch, as a backend's ``_put_entries`` receives it: (collection, key, encoded value, ttl)."""


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
    async def translated(self: StorePrimitives, *args: Any) -> Any:
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


class StorePrimitives(abc.ABC):
    """The backend's side of a store: primitives on validated names and encoded values, and its hooks."""

    _closed = False
    default_collection: str
    """The collection of calls that name none."""

    db_system: ClassVar[str]
    """The backend's ``db.system.name`` in telemetry (``redis``, ``sqlite``...): every backend declares it."""

    connections: int = 10
    """How many calls the backend carries at once (its pool's size; 10 is asyncpg's and asyncmy's
    default pool): with more than one, a batch of coalesced calls flies beside the call in flight
    instead of waiting for it (kvstores._batching). Backends set it from their pool options."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Wrap the backend's primitives in its error translation, once, as the class is made."""
        super().__init_subclass__(**kwargs)
        if cls._translate is not StorePrimitives._translate:
            for name in _PRIMITIVES & cls.__dict__.keys():
                setattr(cls, name, _translating(cls.__dict__[name]))

    def _closed_error(self) -> StoreClosedError:
        return StoreClosedError(f"{type(self).__name__} is closed")

    # -- what every backend implements ---------------------------------------------------

    @abc.abstractmethod
    async def _get_many(self, collection: str, keys: Sequence[str]) -> Sequence[Stored | None]:
        """The stored texts of distinct ``keys``, in order, None for each missing or expired one."""
        raise NotImplementedError

    @abc.abstractmethod
    async def _ttl_many(self, collection: str, keys: Sequence[str]) -> Sequence[tuple[Stored | None, float | None]]:
        """``(stored text, remaining seconds)`` of each of distinct ``keys``: (None, None) when missing."""
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
    async def _keys(self, collection: str, limit: int | None, after: str | None) -> list[str]:
        """Up to ``limit`` live keys after ``after`` (from the first when None), in code-point order."""
        raise NotImplementedError

    @abc.abstractmethod
    async def _collections(self, limit: int | None) -> list[str]:
        """Up to ``limit`` names of collections holding live entries."""
        raise NotImplementedError

    @abc.abstractmethod
    async def _destroy_collection(self, collection: str) -> bool:
        """Delete every entry of ``collection``; True if it held a live one."""
        raise NotImplementedError

    @abc.abstractmethod
    async def _destroy(self) -> bool:
        """Delete every entry the store owns; True if there was a live one."""
        raise NotImplementedError

    @abc.abstractmethod
    async def _cull(self) -> None:
        """Remove the expired entries now."""
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

    # -- hooks with defaults ---------------------------------------------------------------

    def _translate(self, exc: Exception) -> KVStoreError | None:
        """The kvstores error to raise for ``exc``, which one of this store's primitives raised.

        The one place a backend translates its driver's exceptions: StoreConnectionError when
        the backend cannot be reached or timed out, KVStoreError for any other driver error, None
        to let ``exc`` through (a bug, not the driver's). It applies around every primitive
        (:data:`_PRIMITIVES`), with the driver's exception as ``__cause__``; a store with nothing
        to translate (memory) keeps the default and pays nothing.
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

    # -- single keys and batches: bulk calls by default ------------------------------------

    async def _get(self, collection: str, key: str) -> Stored | None:
        return (await self._get_many(collection, [key]))[0]

    async def _ttl(self, collection: str, key: str) -> tuple[Stored | None, float | None]:
        return (await self._ttl_many(collection, [key]))[0]

    async def _put(self, collection: str, key: str, text: str, ttl: float | None) -> None:
        await self._put_many(collection, [key], [text], ttl)

    async def _delete(self, collection: str, key: str) -> bool:
        return await self._delete_many(collection, [key]) > 0

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
