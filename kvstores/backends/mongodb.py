"""MongoDBStore: a persistent store in one MongoDB collection, on pymongo's async API.

Storage: every entry of every kvstores collection is one document of ONE MongoDB
collection (option ``collection``, default ``"kvstores"``) in one database::

    {"_id": "<len(collection)>:<collection><key>", "c": <collection>,
     "v": <value as JSON text>, "e": <expiry as a BSON date, absent if none>}

Why one MongoDB collection rather than one per kvstores collection: names need no
mapping into MongoDB's namespace rules and length limits, and one TTL index serves every
kvstores collection. The ``_id`` is a string that is unique by construction: the decimal
length of the collection name (in code points), a colon, the name, then the key. The
length says where the name ends, so no two (collection, key) pairs share an ``_id``
whatever characters they hold (there is no separator to escape), and the ``_id`` values of
one kvstores collection are exactly those starting with ``<len>:<name>``: listing or
deleting a collection is a range scan of the ``_id`` index, so no other index is needed
(``c`` is kept for ``collections()`` and for people reading the data). A string rather
than an embedded ``{c, k}`` document because a string ``_id`` is a primary-key lookup on
every MongoDB-wire server, while some scan the whole collection for an embedded one. Every write is an upsert on
``_id`` equality, so concurrent first writes of one key leave one document and never
surface DuplicateKeyError (MongoDB >= 4.2 retries such upserts itself).

Atomic operations: ``put_if_absent`` is one upserting replace whose filter matches only an
expired document, so a live one makes the insert collide on ``_id`` (False); ``pop`` is one
``find_one_and_delete``; ``update``'s compare-and-set is one ``replace_one`` (or
``delete_one``) filtered on the ``_id``, the JSON text read and liveness. Strings compare
as exact UTF-8 (no collation), so NFC and NFD forms stay distinct; MongoDB >= 4.2 has no
index key size limit, so the longest names fit.

Values are the codec's JSON text, so every JSON value round-trips exactly: integers
beyond 64 bits, ``$``, ``.`` and empty field names, NUL characters, deep nesting.

Expiry: ``e`` is a wall-clock BSON date (millisecond precision), so every process
agrees; a put without TTL writes no ``e``, clearing an earlier expiry. A TTL index
(``expireAfterSeconds=0``) lets the server reclaim expired documents (MongoDB's monitor
runs about once a minute); until then every read treats them as absent, and ``cull()``
deletes them at once. The TTL index is sparse, so entries without expiry cost it nothing.
It is created lazily by the first operation of each store object; creating an existing
index is a no-op on the server, so processes that start together are safe.

Bulk calls: ``get_many``/``ttl_many`` are one ``find`` with ``$in``, ``put_many`` one
unordered ``bulk_write`` of upserting replaces, ``delete_many`` one ``delete_many``,
each per chunk of ``chunk_size`` keys (default :data:`DEFAULT_CHUNK_SIZE`). A 100-key
call is one round trip, every command stays far below MongoDB's 16 MB limit whatever the
names, and no command runs long enough to meet the socket timeout, even on servers that
match each document against the whole ``$in`` list (O(chunk_size ** 2) per command); raise
``chunk_size`` for huge batches over slow links. ``put_many`` is not
atomic: a failure may leave part of a batch written.

Connections: ``MongoDBStore("mongodb://host:27017/db")`` (also ``mongodb+srv://``)
creates an ``AsyncMongoClient`` that connects on first use and is closed by
``aclose()``; ``timeout`` (seconds, default 5) sets its ``timeoutMS`` (pymongo's
client-side operation timeout, which bounds a whole operation: server selection, waiting for
a pooled connection, connecting, the command and pymongo's one retry of an interrupted
read or write), ``serverSelectionTimeoutMS``, ``connectTimeoutMS`` and ``socketTimeoutMS``
(overriding the same URL options), so an unreachable, hung or blackholed server raises
StoreConnectionError within that time. Other URL query options go to pymongo.
Alternatively pass a client you own: a ``pymongo.AsyncMongoClient`` or a motor
``AsyncIOMotorClient``; the store never closes it and its own timeouts apply. Reads
always go to the primary, so every store object sees every write at once.

Options: ``database`` (default: the URL's database, else ``"kvstores"``), ``collection``,
``timeout``, ``chunk_size``, ``default_collection``. ``destroy()`` empties the store's own
MongoDB collection and never touches anything else in the database.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from kvstores._optional import missing_extra
from kvstores._urls import redact, redact_text
from kvstores.base import DEFAULT_COLLECTION, BaseStore, Entry, Stored, chunks
from kvstores.errors import DeserializationError, KVStoreError, StoreConnectionError
from kvstores.loop import deadline

if TYPE_CHECKING:
    from kvstores._signal_host import Sink, Transport

try:
    from bson import DatetimeMS
    from bson.codec_options import CodecOptions, DatetimeConversion
    from bson.errors import BSONError
    from pymongo import AsyncMongoClient, IndexModel, MongoClient, ReadPreference, ReplaceOne
    from pymongo.errors import ConfigurationError, ConnectionFailure, DuplicateKeyError, ExecutionTimeout, PyMongoError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("pymongo", "mongodb") from exc

__all__ = ["DEFAULT_CHUNK_SIZE", "DEFAULT_DATABASE", "DEFAULT_MONGO_COLLECTION", "MongoDBStore"]

logger = logging.getLogger(__name__)

DEFAULT_DATABASE = "kvstores"
"""Database used when neither the URL nor the ``database`` option names one."""

DEFAULT_MONGO_COLLECTION = "kvstores"
"""MongoDB collection holding every entry, unless the ``collection`` option names another."""

DEFAULT_CHUNK_SIZE = 100
"""Keys per bulk command (a 10,000-key call is 100 commands)."""

# Expiry dates are read as integer milliseconds (bson.DatetimeMS): cheaper than datetime
# objects and independent of the tz_aware setting of a client the user passes in.
_CODEC_OPTIONS: CodecOptions[dict[str, Any]] = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_MS)
_QUERY_OPTIONS = {"collection": str, "timeout": float, "chunk_size": int, "default_collection": str}
_INDEXES = [IndexModel("e", name="kvstores_expiry", expireAfterSeconds=0, sparse=True)]


def _translated_error(exc: Exception) -> KVStoreError | None:
    """Translate pymongo/bson errors: the one place this backend does it."""
    if isinstance(exc, PyMongoError):
        # ConnectionFailure covers AutoReconnect, NetworkTimeout and ServerSelectionTimeoutError
        if isinstance(exc, (ConnectionFailure, ExecutionTimeout)) or exc.timeout:
            return StoreConnectionError(f"MongoDB: {exc}")
        return KVStoreError(f"MongoDB: {exc}")
    if isinstance(exc, BSONError):
        return KVStoreError(f"MongoDB: {exc}")
    return None


def _prefix(collection: str) -> str:
    """The start of the ``_id`` of every entry of ``collection``: its length says where the name ends."""
    return f"{len(collection)}:{collection}"


def _in_collection(collection: str) -> dict[str, Any]:
    """Filter matching every ``_id`` of ``collection``: those starting with its prefix."""
    prefix = _prefix(collection)
    # the least string above every string that starts with prefix (UTF-8 order is code point order)
    stem, last = prefix[:-1], ord(prefix[-1]) + 1
    while last > 0x10FFFF:  # no code point above the last character: carry into the one before
        stem, last = stem[:-1], ord(stem[-1]) + 1
    after = stem + chr(0xE000 if last == 0xD800 else last)  # surrogates never occur in str keys
    return {"_id": {"$gte": prefix, "$lt": after}}


def _now_ms() -> int:
    return int(time.time() * 1000)


def _expiry(ttl: float | None) -> DatetimeMS | None:
    """The wall-clock expiry of an entry written now: never later than ``ttl`` from now, and
    less than a millisecond earlier (at least the next millisecond, for tiny TTLs)."""
    if ttl is None:
        return None
    now_ms = time.time() * 1000
    return DatetimeMS(max(int(now_ms + ttl * 1000), int(now_ms) + 1))


def _live(now_ms: int) -> dict[str, Any]:
    """Filter clause matching documents without expiry or not expired at ``now_ms``.

    ``$not``/``$lte`` rather than ``$or`` of "absent" and ``$gt``: on some MongoDB-wire
    servers a top-level ``$or`` keeps the rest of the filter from using any index.
    """
    return {"e": {"$not": {"$lte": DatetimeMS(now_ms)}}}


def _document(collection: str, text: str, expiry: DatetimeMS | None) -> dict[str, Any]:
    """A document to store; without expiry it has no ``e`` field, so a replace clears the old one."""
    if expiry is None:
        return {"c": collection, "v": text}
    return {"c": collection, "v": text, "e": expiry}


def _text(document: dict[str, Any], now_ms: int) -> str | None:
    """The JSON text of a fetched document, or None if it has expired."""
    expiry = document.get("e")
    if expiry is not None and int(expiry) <= now_ms:
        return None
    text = document.get("v")
    if type(text) is not str:
        raise DeserializationError(f"MongoDB document {document['_id']!r} has no JSON text in field 'v'")
    return text


def _row(document: dict[str, Any] | None, now_ms: int) -> tuple[str | None, float | None]:
    """``(text, remaining seconds)`` of a fetched document, ``(None, None)`` if absent or expired."""
    text = None if document is None else _text(document, now_ms)
    if document is None or text is None:
        return None, None
    expiry = document.get("e")
    return text, None if expiry is None else int(expiry) / 1000 - time.time()


def _client_of(url: str, milliseconds: int) -> Any:
    """pymongo's client for ``url``; a URL it refuses is a ValueError naming the URL redacted (its
    ConfigurationError is no ValueError, and a URL's parser may quote what it could not read)."""
    try:
        return AsyncMongoClient(
            url,
            timeoutMS=milliseconds,  # bounds the whole operation, pymongo's own retry included
            serverSelectionTimeoutMS=milliseconds,
            connectTimeoutMS=milliseconds,
            socketTimeoutMS=milliseconds,
            appname="kvstores",
        )
    except ConfigurationError as exc:
        raise ValueError(f"{redact(url)!r}: {redact_text(str(exc), url)}") from None


class MongoDBStore(BaseStore):
    """A persistent store in one MongoDB collection, shared by every process that opens it.

    URLs: ``mongodb://host:port/database`` or ``mongodb+srv://...``; the store's own query options
    (``collection``, ``timeout``, ``chunk_size``, ``default_collection``, ``batching``) are taken
    out, the rest go to pymongo.
    """

    db_system = "mongodb"
    url_options = _QUERY_OPTIONS

    def __init__(
        self,
        client: Any,
        *,
        database: str | None = None,
        collection: str = DEFAULT_MONGO_COLLECTION,
        timeout: float = 5.0,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        default_collection: str = DEFAULT_COLLECTION,
        batching: bool | None = None,
        encryption_keys: Sequence[str] | None = None,
    ) -> None:
        """Open a store on ``client``: a MongoDB URL, an ``AsyncMongoClient`` or an ``AsyncIOMotorClient``."""
        super().__init__(default_collection=default_collection, batching=batching, encryption_keys=encryption_keys)
        if isinstance(client, MongoClient):
            raise TypeError(
                "MongoDBStore needs an async client: pymongo.AsyncMongoClient or motor's AsyncIOMotorClient"
            )
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self._owns_client = isinstance(client, str)
        if isinstance(client, str):
            client = _client_of(client, int(timeout * 1000))
        self._client: Any = client
        self._timeout = timeout
        self._chunk_size = chunk_size
        db = client.get_default_database(DEFAULT_DATABASE) if database is None else client.get_database(database)
        # Any: pymongo's AsyncCollection or motor's AsyncIOMotorCollection
        self._entries: Any = db.get_collection(
            collection, codec_options=_CODEC_OPTIONS, read_preference=ReadPreference.PRIMARY
        )
        self._indexed = False
        self._index_lock = asyncio.Lock()
        self._index_error: Exception | None = None
        """Why the last attempt to create the indexes failed (None until one fails)."""

    @property
    def database(self) -> str:
        """Name of the database holding the store's collection."""
        return str(self._entries.database.name)

    @property
    def mongo_collection(self) -> str:
        """Name of the MongoDB collection holding every entry."""
        return str(self._entries.name)

    # -- connection ------------------------------------------------------------------

    async def _ready(self) -> Any:
        """The entries collection, with its indexes created on first use.

        A call that waited for another call's attempt fails with that attempt's error rather
        than make its own: while the server is unreachable, each waiter would otherwise try in
        turn, and the last of N calls would wait N timeouts before its own began.
        """
        self._check_open()
        if not self._indexed:
            failed_before = self._index_error
            async with self._index_lock:
                if not self._indexed:
                    if (error := self._index_error) is not failed_before and error is not None:
                        raise error
                    try:
                        await self._entries.create_indexes(_INDEXES)
                    except Exception as exc:
                        self._index_error = exc
                        raise
                    self._indexed, self._index_error = True, None
        return self._entries

    def _server_address(self) -> tuple[str, int] | None:
        seeds = getattr(self._client, "topology_description", None)
        nodes = [] if seeds is None else sorted(seeds.server_descriptions())
        return (str(nodes[0][0]), int(nodes[0][1])) if nodes else None

    def _holds_connection(self) -> bool:
        return self._owns_client and self._indexed

    def _signal_transport(self, sink: Sink) -> Transport[Any]:
        from kvstores.backends._mongodb_signals import MongoDBTransport  # only a store that signals loads it

        return MongoDBTransport(self, sink, self._entries)

    def _translate(self, exc: Exception) -> KVStoreError | None:
        return _translated_error(exc)

    async def _close(self) -> None:
        """Close the client the store made, cut at ``timeout``: ``aclose()`` must return (CI once hung in a
        store's teardown after a burst of timed-out operations; the rest is then left to the collector)."""
        if not self._owns_client:
            return
        try:
            async with deadline(self._timeout):
                await self._client.close()
        except TimeoutError:
            logger.warning(
                "MongoDB: closing the client took over %g s; its connections are left to be collected", self._timeout
            )

    # -- helpers ---------------------------------------------------------------------

    async def _find(self, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The documents of ``ids`` by ``_id`` (expired ones included: callers filter)."""
        entries = await self._ready()
        found: dict[str, dict[str, Any]] = {}
        for chunk in chunks(ids, self._chunk_size):
            for document in await entries.find({"_id": {"$in": chunk}}).to_list(None):
                found[document["_id"]] = document
        return found

    async def _texts(self, ids: Sequence[str]) -> list[str | None]:
        """The live text of each document of ``ids``, None where absent or expired."""
        found = await self._find(ids)
        now_ms = _now_ms()
        return [None if (document := found.get(id_)) is None else _text(document, now_ms) for id_ in ids]

    # -- primitives ------------------------------------------------------------------

    async def _get(self, collection: str, key: str) -> str | None:
        entries = await self._ready()
        document = await entries.find_one({"_id": _prefix(collection) + key})
        return None if document is None else _text(document, _now_ms())

    async def _ttl(self, collection: str, key: str) -> tuple[str | None, float | None]:
        entries = await self._ready()
        document = await entries.find_one({"_id": _prefix(collection) + key})
        return _row(document, _now_ms())

    async def _get_many(self, collection: str, keys: Sequence[str]) -> list[str | None]:
        prefix = _prefix(collection)
        return await self._texts([prefix + key for key in keys])

    async def _get_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[str | None]:
        return await self._texts([_prefix(collection) + key for collection, key in pairs])

    async def _put_entries(self, entries: Sequence[Entry]) -> None:
        await self._bulk_write(
            ReplaceOne({"_id": _prefix(collection) + key}, _document(collection, text, _expiry(ttl)), upsert=True)
            for collection, key, text, ttl in entries
        )

    async def _ttl_many(self, collection: str, keys: Sequence[str]) -> list[tuple[str | None, float | None]]:
        prefix = _prefix(collection)
        ids = [prefix + key for key in keys]
        found = await self._find(ids)
        now_ms = _now_ms()
        return [_row(found.get(id_), now_ms) for id_ in ids]

    async def _put(self, collection: str, key: str, text: str, ttl: float | None) -> None:
        entries = await self._ready()
        await entries.replace_one(
            {"_id": _prefix(collection) + key}, _document(collection, text, _expiry(ttl)), upsert=True
        )

    async def _put_many(self, collection: str, keys: Sequence[str], texts: list[str], ttl: float | None) -> None:
        prefix, expiry = _prefix(collection), _expiry(ttl)
        await self._bulk_write(
            ReplaceOne({"_id": prefix + key}, _document(collection, text, expiry), upsert=True)
            for key, text in zip(keys, texts)
        )

    async def _bulk_write(self, requests: Iterable[ReplaceOne[Any]]) -> None:
        """Run the upserts ``requests``, unordered, ``chunk_size`` per round trip."""
        entries = await self._ready()
        for chunk in chunks(list(requests), self._chunk_size):
            await entries.bulk_write(chunk, ordered=False)

    async def _delete(self, collection: str, key: str) -> bool:
        entries = await self._ready()
        result = await entries.delete_one({"_id": _prefix(collection) + key, **_live(_now_ms())})
        return bool(result.deleted_count)

    async def _delete_many(self, collection: str, keys: Sequence[str]) -> int:
        entries = await self._ready()
        prefix = _prefix(collection)
        deleted = 0
        for chunk in chunks(keys, self._chunk_size):
            query = {"_id": {"$in": [prefix + key for key in chunk]}, **_live(_now_ms())}
            deleted += (await entries.delete_many(query)).deleted_count
        return deleted

    async def _keys(self, collection: str, limit: int | None, after: str | None) -> list[str]:
        entries = await self._ready()
        selected = _in_collection(collection)
        if after is not None:  # a string's order is its UTF-8 bytes': code-point order, as Python compares str
            selected["_id"]["$gt"] = _prefix(collection) + after
        cursor = entries.find({**selected, **_live(_now_ms())}, {"_id": 1}).sort("_id", 1).limit(limit or 0)
        documents = await cursor.to_list(None)
        start = len(_prefix(collection))
        return [document["_id"][start:] for document in documents]

    async def _collections(self, limit: int | None) -> list[str]:
        entries = await self._ready()
        pipeline: list[dict[str, Any]] = [
            {"$match": _live(_now_ms())},
            {"$group": {"_id": "$c"}},
            {"$sort": {"_id": 1}},
        ]
        if limit is not None:
            pipeline.append({"$limit": limit})
        cursor = entries.aggregate(pipeline)
        if inspect.isawaitable(cursor):  # pymongo's aggregate is a coroutine, motor's returns the cursor
            cursor = await cursor
        documents = await cursor.to_list(None)
        return [document["_id"] for document in documents]

    async def _destroy_where(self, where: dict[str, Any]) -> bool:
        entries = await self._ready()
        live = await entries.delete_many({**where, **_live(_now_ms())})
        await entries.delete_many(where)
        return bool(live.deleted_count)

    async def _destroy_collection(self, collection: str) -> bool:
        return await self._destroy_where(_in_collection(collection))

    async def _destroy(self) -> bool:
        return await self._destroy_where({})

    async def _cull(self) -> None:
        entries = await self._ready()
        await entries.delete_many({"e": {"$lte": DatetimeMS(_now_ms())}})

    async def _swap(
        self, collection: str, key: str, expected: Stored | None, text: str | None, ttl: float | None
    ) -> bool:
        entries = await self._ready()
        id_ = _prefix(collection) + key
        now_ms = _now_ms()
        if expected is None and text is not None:
            # put_if_absent: replace an expired document, else insert; a live one makes the
            # upsert's insert collide on _id (the server does not retry: the filter is a range)
            try:
                await entries.replace_one(
                    {"_id": id_, "e": {"$lte": DatetimeMS(now_ms)}},
                    _document(collection, text, _expiry(ttl)),
                    upsert=True,
                )
            except DuplicateKeyError:
                return False
            return True
        if expected is None:  # delete what is absent: succeed while it stays absent
            return not await entries.count_documents({"_id": id_, **_live(now_ms)}, limit=1)
        current = {"_id": id_, "v": expected, **_live(now_ms)}
        if text is None:
            return bool((await entries.delete_one(current)).deleted_count)
        result = await entries.replace_one(current, _document(collection, text, _expiry(ttl)))
        return bool(result.matched_count)

    async def _pop(self, collection: str, key: str) -> str | None:
        entries = await self._ready()
        document = await entries.find_one_and_delete({"_id": _prefix(collection) + key})
        return None if document is None else _text(document, _now_ms())
