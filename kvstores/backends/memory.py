"""MemoryStore: an in-process store on an LRU-ordered dict.

Entries live in one :class:`collections.OrderedDict` kept in least-recently-used order and
keyed by the ``(collection, key)`` tuple, so different pairs can never collide (cachetools'
``LRUCache`` did the same in Python-level calls that cost more than the rest of an atomic
operation). Each entry holds the value encoded (so neither the caller's dict nor a returned
dict can alias stored data) and its expiry time on the monotonic clock. The encoding is
:func:`~kvstores._codec.encode_native`'s bytes: marshal's form where that reads back exactly as
JSON does (values of a few dozen items, the common case: a long string reads back several times
faster than from JSON text), else orjson's own text, tagged; the JSON text every store keeps for
what only the stdlib's path vouches for; with encryption keys, the sealed text.

Bounds and reclamation:

- at most ``max_entries`` entries (default :data:`DEFAULT_MAX_ENTRIES`); beyond that the
  least recently used entry is evicted;
- an expired entry is invisible at once and removed when read; every write sweeps all
  expired entries when ``sweep_interval`` seconds (default 60) have passed since the
  last sweep, and ``cull()`` sweeps at once. Memory therefore never grows beyond the
  live entries plus what was written within one sweep interval, and never beyond
  ``max_entries``.

Options: ``max_entries``, ``sweep_interval``, ``default_collection``, and ``batching``, which
every store accepts: a MemoryStore has no round trips to share, so it never coalesces calls.
URL: ``memory://`` (query options, e.g. ``memory://?max_entries=1000``).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from time import monotonic
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from kvstores._codec import decode_native, encode_native
from kvstores.base import DEFAULT_COLLECTION, BaseStore, Stored

if TYPE_CHECKING:
    from kvstores._signal_host import Sink, Transport

__all__ = ["DEFAULT_MAX_ENTRIES", "MemoryStore"]

DEFAULT_MAX_ENTRIES = 100_000
"""Default bound on the number of entries a MemoryStore holds."""

_QUERY_OPTIONS = {"max_entries": int, "sweep_interval": float, "default_collection": str}
_Entry = tuple[Stored, float | None]  # (encoded value, monotonic expiry or None)


class _LRU(OrderedDict[tuple[str, str], _Entry]):
    """Entries, least recently used first; MemoryStore refreshes and evicts (``maxsize``: the bound)."""

    def __init__(self, maxsize: int) -> None:
        super().__init__()
        self.maxsize = maxsize

    def write(self, pair: tuple[str, str], entry: _Entry) -> None:
        """Store ``entry`` as the most recently used, evicting the least recently used beyond maxsize."""
        self[pair] = entry
        self.move_to_end(pair)
        if len(self) > self.maxsize:
            self.popitem(last=False)


class MemoryStore(BaseStore):
    """A bounded in-memory store with per-entry TTL and LRU eviction."""

    db_system = "memory"
    url_options = _QUERY_OPTIONS
    batching_default = False  # nothing to coalesce: no round trips

    def __init__(
        self,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        sweep_interval: float = 60.0,
        default_collection: str = DEFAULT_COLLECTION,
        batching: bool | None = None,
        encryption_keys: Sequence[str] | None = None,
    ) -> None:
        # batching off whatever it is told: nothing to coalesce without round trips
        super().__init__(default_collection=default_collection, batching=False, encryption_keys=encryption_keys)
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self._cache = _LRU(max_entries)
        self._sweep_interval = sweep_interval
        self._next_sweep = monotonic() + sweep_interval

    @classmethod
    def _from_parsed_url(cls, url: str, **options: Any) -> MemoryStore:
        """Open ``memory://`` (its options in the query)."""
        if urlsplit(url).query:
            raise ValueError(f"unknown options in a memory:// URL; it takes {', '.join(_QUERY_OPTIONS)}, batching")
        return cls(**options)

    def __len__(self) -> int:
        """The number of entries held, including expired ones not yet reclaimed."""
        return len(self._cache)

    def __bool__(self) -> bool:
        """Always true, even when empty: ``store or default`` (as FastMCP writes) must keep the store."""
        return True

    def _signal_transport(self, sink: Sink) -> Transport[Any]:
        from kvstores.backends._memory_signals import MemoryTransport  # only a store that signals loads it

        return MemoryTransport(self, sink)

    def _encoded(self, value: Mapping[str, Any]) -> Stored:  # type: ignore[override]
        """``value`` as :func:`~kvstores._codec.encode_native` encodes it (bytes reach only this
        store's own primitives, which take them); JSON text when the store has encryption keys (it seals text)."""
        if self._sealer is not None:
            return super()._encoded(value)
        return encode_native(value)

    def _decoded(self, stored: Stored, collection: str, key: str) -> dict[str, Any]:
        """The value of ``stored``: :func:`~kvstores._codec.encode_native`'s bytes (only :meth:`_encoded`
        writes bytes), else text."""
        if type(stored) is bytes:
            return decode_native(stored, key)
        return super()._decoded(stored, collection, key)

    def _live(self, collection: str, key: str, now: float) -> _Entry | None:
        """The entry of (collection, key), or None; an expired entry is removed on the way."""
        pair = (collection, key)
        entry = self._cache.get(pair)
        if entry is None:
            return None
        if entry[1] is not None and entry[1] <= now:
            del self._cache[pair]
            return None
        self._cache.move_to_end(pair)
        return entry

    def _scan(self) -> list[tuple[tuple[str, str], float | None]]:
        """Every (pair, expiry), read without refreshing LRU order."""
        return [(pair, entry[1]) for pair, entry in self._cache.items()]

    def _sweep(self, now: float) -> None:
        for pair, expires in self._scan():
            if expires is not None and expires <= now:
                del self._cache[pair]
        self._next_sweep = now + self._sweep_interval

    async def _get(self, collection: str, key: str) -> Stored | None:
        entry = self._live(collection, key, monotonic())
        return None if entry is None else entry[0]

    async def _put(self, collection: str, key: str, text: Stored, ttl: float | None) -> None:
        now = monotonic()
        if now >= self._next_sweep:
            self._sweep(now)
        self._cache.write((collection, key), (text, None if ttl is None else now + ttl))

    async def _get_many(self, collection: str, keys: Sequence[str]) -> list[Stored | None]:
        now = monotonic()
        entries = [self._live(collection, key, now) for key in keys]
        return [None if entry is None else entry[0] for entry in entries]

    async def _ttl_many(self, collection: str, keys: Sequence[str]) -> list[tuple[Stored | None, float | None]]:
        now = monotonic()
        rows: list[tuple[Stored | None, float | None]] = []
        for key in keys:
            entry = self._live(collection, key, now)
            if entry is None:
                rows.append((None, None))
            else:
                rows.append((entry[0], None if entry[1] is None else entry[1] - now))
        return rows

    async def _put_many(self, collection: str, keys: Sequence[str], texts: Sequence[Stored], ttl: float | None) -> None:
        now = monotonic()
        if now >= self._next_sweep:
            self._sweep(now)
        expires = None if ttl is None else now + ttl
        write = self._cache.write
        for key, text in zip(keys, texts):
            write((collection, key), (text, expires))

    async def _delete_many(self, collection: str, keys: Sequence[str]) -> int:
        now = monotonic()
        deleted = 0
        for key in keys:
            entry = self._cache.pop((collection, key), None)
            if entry is not None and (entry[1] is None or entry[1] > now):
                deleted += 1
        return deleted

    def _live_pairs(self) -> list[tuple[str, str]]:
        now = monotonic()
        return [pair for pair, expires in self._scan() if expires is None or expires > now]

    async def _keys(self, collection: str, limit: int | None, after: str | None) -> list[str]:
        keys = (key for name, key in self._live_pairs() if name == collection and (after is None or key > after))
        return sorted(keys) if limit is None else heapq.nsmallest(limit, keys)

    async def _collections(self, limit: int | None) -> list[str]:
        names = list(dict.fromkeys(name for name, _ in self._live_pairs()))
        return names[:limit]

    async def _destroy_collection(self, collection: str) -> bool:
        now = monotonic()
        live = False
        for pair, expires in self._scan():
            if pair[0] == collection:
                live = live or expires is None or expires > now
                del self._cache[pair]
        return live

    async def _destroy(self) -> bool:
        live = bool(self._live_pairs())
        self._cache.clear()
        return live

    async def _cull(self) -> None:
        self._sweep(monotonic())

    async def _ping(self) -> None:
        """Nothing to reach: the store is in this process."""

    # no await between reading and writing: each of these is atomic on the event loop

    async def _swap(
        self, collection: str, key: str, expected: Stored | None, text: Stored | None, ttl: float | None
    ) -> bool:
        now = monotonic()
        entry = self._live(collection, key, now)
        if (None if entry is None else entry[0]) != expected:
            return False
        if text is None:
            del self._cache[collection, key]
        else:
            if now >= self._next_sweep:
                self._sweep(now)
            self._cache.write((collection, key), (text, None if ttl is None else now + ttl))
        return True

    async def _pop(self, collection: str, key: str) -> Stored | None:
        entry = self._cache.pop((collection, key), None)  # an expired entry goes too
        if entry is None or (entry[1] is not None and entry[1] <= monotonic()):
            return None
        return entry[0]
