"""RedisStore: a store on Redis or Redis Cluster, on redis-py's asyncio client (redis >= 5).

Layout: each entry is one Redis string whose value is the entry's JSON text, under the key::

    <prefix>{<collection, with % { } written as %25 %7B %7D>}<key>

The collection is the key's hash tag, so all keys of one collection share a Cluster slot
(a call's MGET, DEL, pipeline or script never raises CROSSSLOT). The first ``}`` ends the tag and the rest is
the key verbatim, so no two (collection, key) pairs share a Redis key whatever characters
they hold. The prefix (default ``"kvstores"``) must be non-empty and must not contain ``{``.

Commands: get = GET; ttl = GET + PTTL in one pipeline; get_many = MGET; ttl_many = MGET +
PTTLs in one pipeline; put = SET (``PX`` milliseconds when a TTL is given; a plain SET clears
an earlier TTL); put_many = one Lua script call (EVALSHA) running the same SETs, atomic like
MULTI/EXEC and also on a Cluster, for up to 10,000 keys (larger calls run as consecutive
calls of 10,000 keys); delete/delete_many = DEL.
MGET and DEL take at most 1,000 keys each; more are pipelined in one round trip.
Atomic operations: put_if_absent = SET NX (PX); pop = GETDEL (Redis >= 6.2); update's
compare-and-set = one Lua script call that compares the stored string with the one read
(an expired key reads as absent, so it never matches) — all on the key's own slot.
keys(), collections(), destroy_collection() and destroy() SCAN (every primary of a Cluster)
with the prefix and collection glob-escaped; destroy() deletes only keys under the prefix,
never FLUSHDB. Redis expires entries itself, so ``cull()`` has nothing to do.

URLs: ``redis://[user:password@]host:6379/0``, ``rediss://...`` (TLS), ``unix:///path.sock?db=0``
``redis+cluster://host:port`` for a Cluster (any one node), and
``redis+sentinel://[user:password@]host:26379[,host2:26379...]/service_name[/db]`` for a
primary that Redis Sentinel watches (the credentials are the primary's; pass
``sentinel_kwargs={...}`` for the sentinels' own). The URL goes to redis-py's
``from_url`` unchanged apart from the store's own query options (``prefix``, ``timeout``,
``max_connections``, ``default_collection``), so every redis-py URL option keeps working
(e.g. ``?health_check_interval=30``, ``?ssl_ca_certs=...``); one redis-py does not know is a
ValueError when the store is made (redis-py itself would raise a TypeError at the first call).

Options: ``prefix``; ``timeout`` (default 5 s: bounds connecting and each reply, so an
unreachable or hung server raises StoreConnectionError instead of hanging);
``max_connections`` (default 50, per server: more concurrent operations queue for a
connection instead of failing); ``default_collection``; other keyword options go to
redis-py's client. Or pass ``client=`` a ``redis.asyncio.Redis`` or ``RedisCluster`` you
own: the store never closes it, and the client's own settings (timeouts, retries, pool
size) apply; a client made by ``redis.asyncio.sentinel.Sentinel(...).master_for(name)`` follows
failovers as the URL's does.

Sentinel: every new connection asks the sentinels (in turn; one look-up at a time for a
``redis+sentinel://`` URL, see ``_redis_client._Sentinel``) for the current primary, and a
connection to a primary that was demoted is dropped (redis-py turns its READONLY replies into
connection errors). So during a failover calls raise StoreConnectionError, and once the
sentinels have promoted a replica the same store object carries on there. Replication is
asynchronous: writes the old primary acknowledged but had not yet sent to the replica are
lost when it dies (SECURITY.md gives the measured window).

A connection refused or reset is retried twice with a short backoff, so a restarted server
is picked up by the same store object; timeouts are not retried. Commands that must run at
most once are never retried once they may have been sent (pop's GETDEL, put_if_absent's
SET NX, update's compare-and-set, and the one DEL of ``delete`` and of a ``delete_many`` of
up to 1,000 keys): the first attempt may have run before its reply was lost, and a second
would answer wrongly (None for the value the first GETDEL removed, False for the value the
first SET NX stored) or apply ``update``'s function twice. Such a call raises
StoreConnectionError instead, and its outcome is unknown. The pipelined DELs of a larger
``delete_many`` and the DELs of ``destroy_collection`` and ``destroy`` do run under the retry
policy: the keys end up deleted either way, but a retried DEL can under-count (0, or False from
``destroy_collection``, for keys its lost first attempt removed). A client you pass in keeps its own retry policy
(redis-py's default retries every command, these included).
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, Final, cast
from urllib.parse import unquote

from kvstores._codec import ttl_milliseconds
from kvstores._optional import missing_extra
from kvstores.base import DEFAULT_COLLECTION, BaseStore, Entry, Stored, chunks
from kvstores.errors import KVStoreError, StoreConnectionError

if TYPE_CHECKING:
    from kvstores._signal_host import Sink, Transport

try:
    from redis import exceptions as redis_errors
    from redis.asyncio import Redis, RedisCluster
    from redis.asyncio.sentinel import Sentinel

    from kvstores.backends._redis_client import AT_MOST_ONCE, Client, Gate, close_client, connect, listener
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("redis", "redis") from exc

__all__ = ["DEFAULT_PREFIX", "RedisStore"]

DEFAULT_PREFIX = "kvstores"
"""The key prefix used when none is given."""

_STORE_QUERY_OPTIONS = {"prefix": str, "timeout": float, "max_connections": int, "default_collection": str}
_CHUNK: Final = 1_000  # keys per MGET / DEL
_ATOMIC_CHUNK: Final = 10_000  # keys per put_many script call
# put_many: SET every key, with PX ARGV[1] unless it is empty, in one atomic script call.
# (MULTI/EXEC would do on a single server, but redis-py's asyncio RedisCluster transactions
# run a thread and an event loop per queued command.)
_PUT_SCRIPT = """
local px = ARGV[1]
for i, key in ipairs(KEYS) do
  if px == '' then
    redis.call('SET', key, ARGV[i + 1])
  else
    redis.call('SET', key, ARGV[i + 1], 'PX', px)
  end
end
return #KEYS
"""
# compare-and-set for update(): replace (or delete, when ARGV[2] is empty) the value ARGV[1]
# with ARGV[2], PX ARGV[3] unless empty; 0 when the stored value is no longer ARGV[1].
# An expired key is absent to GET, so it never matches.
_SWAP_SCRIPT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
elseif ARGV[3] == '' then
  redis.call('SET', KEYS[1], ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
"""
_SCAN_COUNT: Final = 1_000
_HEADS_CACHED: Final = 1_000  # collections whose key head is kept ready
_TAG_ESCAPES = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D"})
_GLOB_ESCAPES = str.maketrans({char: "\\" + char for char in "*?[]\\"})
_UNREACHABLE = (
    redis_errors.ConnectionError,  # includes BusyLoadingError and MaxConnectionsError
    redis_errors.TimeoutError,
    redis_errors.ClusterDownError,  # includes MasterDownError
    redis_errors.TryAgainError,
    redis_errors.SlotNotCoveredError,
)


def _translated_error(exc: Exception) -> KVStoreError | None:
    """Translate redis-py errors: the one place this backend does it."""
    if isinstance(exc, _UNREACHABLE) or isinstance(exc.__cause__, _UNREACHABLE):  # "Cluster cannot be connected"
        return StoreConnectionError(f"Redis: {exc}")
    if isinstance(exc, (redis_errors.RedisError, redis_errors.RedisClusterException)):
        return KVStoreError(f"Redis: {exc}")
    return None


def _glob(text: str) -> str:
    """``text`` as a SCAN MATCH pattern that matches only itself."""
    return text.translate(_GLOB_ESCAPES)


def _decoded(raw: bytes | str) -> str | None:
    """A Redis key as text, or None when it is not UTF-8 (so not written by kvstores)."""
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return None


def _remaining(milliseconds: int) -> float | None:
    """PTTL's reply as seconds: None for no expiry (-1)."""
    return None if milliseconds < 0 else milliseconds / 1000


class RedisStore(BaseStore):
    """A store on Redis (standalone or Cluster) with native millisecond TTLs.

    ``client`` is the redis-py client in use and ``prefix`` the prefix of every Redis key.
    URLs: ``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://`` or ``redis+sentinel://``.
    """

    db_system = "redis"
    url_options = _STORE_QUERY_OPTIONS

    def __init__(
        self,
        url: str | None = None,
        *,
        client: Client | None = None,
        prefix: str = DEFAULT_PREFIX,
        timeout: float = 5.0,
        max_connections: int = 50,
        default_collection: str = DEFAULT_COLLECTION,
        batching: bool | None = None,
        encryption_keys: Sequence[str] | None = None,
        **client_options: Any,
    ) -> None:
        super().__init__(default_collection=default_collection, batching=batching, encryption_keys=encryption_keys)
        if not isinstance(prefix, str) or not prefix or "{" in prefix:
            raise ValueError(f"prefix must be a non-empty str without '{{', got {prefix!r}")
        if (url is None) == (client is None):
            raise TypeError("RedisStore needs either a URL or client=, not both")
        if client is not None and not isinstance(client, (Redis, RedisCluster)):
            raise TypeError(f"client must be a redis.asyncio Redis or RedisCluster, not {type(client).__name__}")
        self.prefix = prefix
        self._timeout = timeout
        self._pattern = _glob(prefix) + "{*"  # every key under the prefix
        self._owns_client = client is None
        self._sentinel: Sentinel | None = None
        if client is None:
            assert url is not None
            client, self._sentinel = connect(url, timeout, max_connections, client_options)
        self.client = client
        cluster = client if isinstance(client, RedisCluster) else None
        self._gate = Gate(max_connections if self._owns_client else None, cluster)
        self.connections = max_connections
        self._heads: dict[str, str] = {}
        self._put_script = client.register_script(_PUT_SCRIPT)
        self._swap_script = client.register_script(_SWAP_SCRIPT)

    def _server_address(self) -> tuple[str, int] | None:
        if isinstance(self.client, RedisCluster):  # the node it was told to start from
            node = next(iter(self.client.nodes_manager.startup_nodes.values()), None)
            return None if node is None else (str(node.host), int(node.port))
        settings = self.client.connection_pool.connection_kwargs  # no host: a unix socket or a sentinel
        host, port = settings.get("host"), settings.get("port")
        return None if host is None or port is None else (str(host), int(port))

    def _holds_connection(self) -> bool:
        return self._owns_client and self._gate.used

    def _signal_transport(self, sink: Sink) -> Transport[Any]:
        from kvstores.backends._redis_signals import RedisTransport  # only a store that signals loads it

        return RedisTransport(self, sink, client=self.client, gate=self._gate, prefix=self.prefix)

    def listener(self) -> tuple[Client, Callable[[], Awaitable[None]]]:
        """A client for the signal transport's pub/sub connection, and what lets it go (:func:`listener`)."""
        return listener(self.client)

    def _translate(self, exc: Exception) -> KVStoreError | None:
        return _translated_error(exc)

    async def _close(self) -> None:
        await self._gate.close(self._timeout)
        if self._owns_client:
            try:
                await close_client(self.client)
            finally:  # the sentinels' connections too, whatever closing the primary's raised
                if self._sentinel is not None:
                    await self._sentinel.aclose()

    # -- keys ----------------------------------------------------------------------

    def _head(self, collection: str) -> str:
        """The start of every Redis key of ``collection``: the prefix and the hash tag."""
        head = self._heads.get(collection)
        if head is None:
            if len(self._heads) >= _HEADS_CACHED:
                self._heads.clear()
            head = self._heads[collection] = f"{self.prefix}{{{collection.translate(_TAG_ESCAPES)}}}"
        return head

    def _names(self, collection: str, keys: Iterable[str]) -> list[str]:
        """The Redis keys of ``keys`` in ``collection``."""
        head = self._head(collection)
        return [head + key for key in keys]

    def _collection_of(self, name: str) -> str | None:
        """The collection of a Redis key under the prefix, or None if kvstores did not write it."""
        start = len(self.prefix) + 1
        close = name.find("}", start)
        if close <= start or not name.startswith(self.prefix + "{"):
            return None
        tag = name[start:close]
        collection = unquote(tag)
        return collection if collection.translate(_TAG_ESCAPES) == tag else None

    # -- commands ------------------------------------------------------------------

    async def _execute(self, *args: Any) -> Any:
        async with self._gate:
            return await self.client.execute_command(*args)

    async def _execute_once(self, *args: Any) -> Any:
        """``_execute`` for a command that must run at most once: never retried once it may have been sent."""
        token = AT_MOST_ONCE.set(True)
        try:
            return await self._execute(*args)
        finally:
            AT_MOST_ONCE.reset(token)

    async def _pipeline(self, commands: Iterable[Sequence[Any]]) -> list[Any]:
        """Send ``commands`` in one round trip (not a transaction) and return their replies."""
        async with self._gate:
            pipe = self.client.pipeline(transaction=False)
            for args in commands:
                pipe.execute_command(*args)
            return await pipe.execute()

    async def _scan(self, pattern: str, limit: int | None, convert: Callable[[str], str | None]) -> list[str]:
        """Distinct ``convert(name)`` of the Redis keys matching ``pattern`` on every primary.

        Names that convert to None are skipped; the scan stops once ``limit`` are found.
        """
        found: dict[str, None] = {}
        async with self._gate:
            scan = cast(AsyncGenerator[Any, None], self.client.scan_iter(match=pattern, count=_SCAN_COUNT))
            async with aclosing(scan) as names:
                async for raw in names:
                    name = _decoded(raw)
                    item = None if name is None else convert(name)
                    if item is not None:
                        found[item] = None
                        if len(found) == limit:
                            break
        return list(found)

    async def _delete_names(self, names: Sequence[str]) -> int:
        """DEL ``names`` (any slots), 1,000 at a time; return how many existed."""
        deleted = 0
        for chunk in chunks(names, _CHUNK):
            async with self._gate:
                deleted += await self.client.delete(*chunk)
        return deleted

    # -- primitives ----------------------------------------------------------------

    async def _get(self, collection: str, key: str) -> Stored | None:
        return cast("Stored | None", await self._execute("GET", self._head(collection) + key))

    async def _ttl(self, collection: str, key: str) -> tuple[Stored | None, float | None]:
        name = self._head(collection) + key
        raw, milliseconds = await self._pipeline((("GET", name), ("PTTL", name)))
        if raw is None or milliseconds == -2:  # -2: it expired between GET and PTTL
            return None, None
        return raw, _remaining(milliseconds)

    async def _get_many(self, collection: str, keys: Sequence[str]) -> list[Stored | None]:
        names = self._names(collection, keys)
        if len(names) <= _CHUNK:
            values = await self._execute("MGET", *names)
        else:
            replies = await self._pipeline([("MGET", *chunk) for chunk in chunks(names, _CHUNK)])
            values = [value for reply in replies for value in reply]
        return cast("list[Stored | None]", values)

    async def _get_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[Stored | None]:
        names = [self._head(collection) + key for collection, key in pairs]
        by_collection: dict[str, list[str]] = {}
        for (collection, _), name in zip(pairs, names):
            by_collection.setdefault(collection, []).append(name)
        # one MGET per collection (its keys share a slot), all in one pipeline: one round trip
        mgets = [chunk for group in by_collection.values() for chunk in chunks(group, _CHUNK)]
        replies = await self._pipeline(("MGET", *chunk) for chunk in mgets)
        found = {name: value for chunk, reply in zip(mgets, replies) for name, value in zip(chunk, reply)}
        return [found[name] for name in names]

    async def _put_entries(self, entries: Sequence[Entry]) -> None:
        await self._pipeline(
            ("SET", self._head(collection) + key, text)
            if ttl is None
            else ("SET", self._head(collection) + key, text, "PX", ttl_milliseconds(ttl))
            for collection, key, text, ttl in entries
        )

    async def _ttl_many(self, collection: str, keys: Sequence[str]) -> list[tuple[Stored | None, float | None]]:
        names = self._names(collection, keys)
        mgets = [("MGET", *chunk) for chunk in chunks(names, _CHUNK)]
        replies = await self._pipeline([*mgets, *(("PTTL", name) for name in names)])
        values = [value for reply in replies[: len(mgets)] for value in reply]
        return [
            (None, None) if raw is None or milliseconds == -2 else (raw, _remaining(milliseconds))
            for raw, milliseconds in zip(values, replies[len(mgets) :])
        ]

    async def _put(self, collection: str, key: str, text: str, ttl: float | None) -> None:
        name = self._head(collection) + key
        if ttl is None:
            await self._execute("SET", name, text)
        else:
            await self._execute("SET", name, text, "PX", ttl_milliseconds(ttl))

    async def _put_many(self, collection: str, keys: Sequence[str], texts: list[str], ttl: float | None) -> None:
        names = self._names(collection, keys)
        milliseconds = "" if ttl is None else str(ttl_milliseconds(ttl))
        for start in range(0, len(names), _ATOMIC_CHUNK):
            end = start + _ATOMIC_CHUNK
            async with self._gate:
                await self._put_script(keys=names[start:end], args=[milliseconds, *texts[start:end]])

    async def _delete(self, collection: str, key: str) -> bool:
        return bool(await self._execute_once("DEL", self._head(collection) + key))

    async def _delete_many(self, collection: str, keys: Sequence[str]) -> int:
        names = self._names(collection, keys)
        if len(names) <= _CHUNK:
            return int(await self._execute_once("DEL", *names))
        return sum(await self._pipeline([("DEL", *chunk) for chunk in chunks(names, _CHUNK)]))

    async def _keys(self, collection: str, limit: int | None, after: str | None) -> list[str]:
        head = self._head(collection)

        def key_after(name: str) -> str | None:
            key = name[len(head) :]
            return key if after is None or key > after else None

        # SCAN has no order: the collection is read whole, and the least ``limit`` of it kept
        keys = await self._scan(_glob(head) + "*", None, key_after)
        return sorted(keys) if limit is None else heapq.nsmallest(limit, keys)

    async def _collections(self, limit: int | None) -> list[str]:
        return await self._scan(self._pattern, limit, self._collection_of)

    async def _destroy_collection(self, collection: str) -> bool:
        names = await self._scan(_glob(self._head(collection)) + "*", None, str)
        return await self._delete_names(names) > 0

    async def _destroy(self) -> bool:
        names = await self._scan(self._pattern, None, lambda name: None if self._collection_of(name) is None else name)
        return await self._delete_names(names) > 0

    async def _cull(self) -> None:
        """Nothing to do: Redis reclaims expired keys itself."""

    async def _swap(
        self, collection: str, key: str, expected: Stored | None, text: str | None, ttl: float | None
    ) -> bool:
        name = self._head(collection) + key
        milliseconds = "" if ttl is None else str(ttl_milliseconds(ttl))
        if expected is None and text is not None:  # put_if_absent: SET NX, one command
            expiry = () if ttl is None else ("PX", milliseconds)
            return bool(await self._execute_once("SET", name, text, "NX", *expiry))
        if expected is None:  # delete what is absent: succeed while it stays absent
            return not await self._execute("EXISTS", name)
        token = AT_MOST_ONCE.set(True)
        try:
            async with self._gate:
                return bool(await self._swap_script(keys=[name], args=[expected, text or "", milliseconds]))
        finally:
            AT_MOST_ONCE.reset(token)

    async def _pop(self, collection: str, key: str) -> Stored | None:
        return cast("Stored | None", await self._execute_once("GETDEL", self._head(collection) + key))
