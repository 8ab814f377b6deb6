"""MongoDBStore: a persistent store in one MongoDB collection, on pymongo's async API.

Storage: every entry of every kvstores collection is one document of ONE MongoDB
collection (option ``collection``, default ``"kvstores"``) in one database::

    {"_id": {"c": <collection>, "k": <key>}, "v": <value as JSON text>, "e": <expiry, BSON date>}

Why one MongoDB collection with a compound ``_id`` rather than one MongoDB collection per
kvstores collection: names need no mapping into MongoDB's namespace rules and length
limits, there is one TTL index instead of one per collection, and listing, counting or
deleting one kvstores collection is an index scan on ``_id.c``. The ``_id`` is an
embedded document that this module always builds in the same field order (``c`` then
``k``): MongoDB compares embedded documents field by field, in order, so the pair is
unique by construction (no separator, nothing to escape), and because every write is an
upsert on ``_id`` equality, concurrent first writes of one key leave one document and
never surface DuplicateKeyError (MongoDB >= 4.2 retries such upserts itself). Keys and
collection names compare as exact UTF-8 strings (no collation), so NFC and NFD forms stay
distinct; MongoDB >= 4.2 has no index key size limit, so the longest names fit.

Values are the codec's JSON text, so every JSON value round-trips exactly: integers
beyond 64 bits, ``$``, ``.`` and empty field names, NUL characters, deep nesting.

Expiry: ``e`` is a wall-clock BSON date (millisecond precision), so every process
agrees; a put without TTL writes no ``e``, clearing an earlier expiry. A TTL index
(``expireAfterSeconds=0``) lets the server reclaim expired documents (MongoDB's monitor
runs about once a minute); until then every read treats them as absent, and ``cull()``
deletes them at once. Indexes are created lazily by the first operation of each store
object; creating an existing index is a no-op on the server, so processes that start
together are safe.

Bulk calls: ``get_many``/``ttl_many`` are one ``find`` with ``$in``, ``put_many`` one
unordered ``bulk_write`` of upserting replaces, ``delete_many`` one ``delete_many``,
each per chunk of :data:`CHUNK_SIZE` keys (a 10,000-key call is 10 round trips, and every
command stays far below MongoDB's 16 MB command size). ``put_many`` is not atomic: a
failure may leave part of a batch written.

Connections: ``MongoDBStore("mongodb://host:27017/db")`` (also ``mongodb+srv://``)
creates an ``AsyncMongoClient`` that connects on first use and is closed by
``aclose()``; ``timeout`` (seconds, default 5) sets its ``serverSelectionTimeoutMS``,
``connectTimeoutMS`` and ``socketTimeoutMS`` (overriding the same URL options), so an
unreachable server raises StoreConnectionError within about that time (twice it at most,
when pymongo retries an interrupted operation once). Other URL query options go to pymongo.
Alternatively pass a client you own: a ``pymongo.AsyncMongoClient`` or a motor
``AsyncIOMotorClient``; the store never closes it and its own timeouts apply. Reads
always go to the primary, so every store object sees every write at once.

Options: ``database`` (default: the URL's database, else ``"kvstores"``), ``collection``,
``timeout``, ``default_collection``. ``destroy()`` empties the store's own MongoDB
collection and never touches anything else in the database.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from kvstores._codec import ttl_milliseconds
from kvstores._optional import missing_extra
from kvstores.base import DEFAULT_COLLECTION, BaseStore
from kvstores.errors import DeserializationError, KVStoreError, StoreConnectionError

try:
    from bson import DatetimeMS
    from bson.codec_options import CodecOptions, DatetimeConversion
    from bson.errors import BSONError
    from pymongo import AsyncMongoClient, IndexModel, MongoClient, ReadPreference, ReplaceOne
    from pymongo.errors import ConnectionFailure, ExecutionTimeout, PyMongoError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("pymongo", "mongodb") from exc

__all__ = ["CHUNK_SIZE", "DEFAULT_DATABASE", "DEFAULT_MONGO_COLLECTION", "MongoDBStore"]

DEFAULT_DATABASE = "kvstores"
"""Database used when neither the URL nor the ``database`` option names one."""

DEFAULT_MONGO_COLLECTION = "kvstores"
"""MongoDB collection holding every entry, unless the ``collection`` option names another."""

CHUNK_SIZE = 1000
"""Keys per bulk command: at most ~8 MB of ``_id`` values even with the longest names."""

# Expiry dates are read as integer milliseconds (bson.DatetimeMS): cheaper than datetime
# objects and independent of the tz_aware setting of a client the user passes in.
_CODEC_OPTIONS: CodecOptions[dict[str, Any]] = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_MS)
_INDEXES = [
    IndexModel("e", name="kvstores_expiry", expireAfterSeconds=0),
    IndexModel("_id.c", name="kvstores_collection"),
]


@contextmanager
def _translated() -> Iterator[None]:
    """Translate pymongo/bson errors: the one place this backend does it."""
    try:
        yield
    except PyMongoError as exc:
        # ConnectionFailure covers AutoReconnect, NetworkTimeout and ServerSelectionTimeoutError
        if isinstance(exc, (ConnectionFailure, ExecutionTimeout)) or exc.timeout:
            raise StoreConnectionError(f"MongoDB: {exc}") from exc
        raise KVStoreError(f"MongoDB: {exc}") from exc
    except BSONError as exc:
        raise KVStoreError(f"MongoDB: {exc}") from exc


def _now_ms() -> int:
    return int(time.time() * 1000)


def _live(now_ms: int) -> dict[str, Any]:
    """Filter matching documents that never expire or have not expired at ``now_ms``."""
    return {"$or": [{"e": None}, {"e": {"$gt": DatetimeMS(now_ms)}}]}


def _ids(collection: str, keys: Sequence[str]) -> list[dict[str, str]]:
    return [{"c": collection, "k": key} for key in keys]


def _chunks(keys: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(keys), CHUNK_SIZE):
        yield keys[start : start + CHUNK_SIZE]


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


class MongoDBStore(BaseStore):
    """A persistent store in one MongoDB collection, shared by every process that opens it."""

    def __init__(
        self,
        client: Any,
        *,
        database: str | None = None,
        collection: str = DEFAULT_MONGO_COLLECTION,
        timeout: float = 5.0,
        default_collection: str = DEFAULT_COLLECTION,
    ) -> None:
        """Open a store on ``client``: a MongoDB URL, an ``AsyncMongoClient`` or an ``AsyncIOMotorClient``."""
        super().__init__(default_collection=default_collection)
        if isinstance(client, MongoClient):
            raise TypeError(
                "MongoDBStore needs an async client: pymongo.AsyncMongoClient or motor's AsyncIOMotorClient"
            )
        self._owns_client = isinstance(client, str)
        if isinstance(client, str):
            milliseconds = int(timeout * 1000)
            client = AsyncMongoClient(
                client,
                serverSelectionTimeoutMS=milliseconds,
                connectTimeoutMS=milliseconds,
                socketTimeoutMS=milliseconds,
                appname="kvstores",
            )
        self._client: Any = client
        db = client.get_default_database(DEFAULT_DATABASE) if database is None else client.get_database(database)
        # Any: the collection is pymongo's AsyncCollection or motor's untyped equivalent
        self._entries: Any = db.get_collection(
            collection, codec_options=_CODEC_OPTIONS, read_preference=ReadPreference.PRIMARY
        )
        self._indexed = False
        self._index_lock = asyncio.Lock()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MongoDBStore:
        """Open ``mongodb://host:port/database`` or ``mongodb+srv://...``; ``options`` as for the constructor."""
        return cls(url, **options)

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
        """The entries collection, with its indexes created on first use."""
        if not self._indexed:
            async with self._index_lock:
                if not self._indexed:
                    with _translated():
                        await self._entries.create_indexes(_INDEXES)
                    self._indexed = True
        return self._entries

    async def _close(self) -> None:
        if self._owns_client:
            with _translated():
                await self._client.close()

    # -- primitives ------------------------------------------------------------------

    def _document(self, text: str, ttl: float | None) -> dict[str, Any]:
        if ttl is None:
            return {"v": text}
        return {"v": text, "e": DatetimeMS(_now_ms() + ttl_milliseconds(ttl))}

    async def _get(self, collection: str, key: str) -> str | None:
        entries = self._entries if self._indexed else await self._ready()
        with _translated():
            document = await entries.find_one({"_id": {"c": collection, "k": key}})
        return None if document is None else _text(document, _now_ms())

    async def _ttl(self, collection: str, key: str) -> tuple[str | None, float | None]:
        entries = self._entries if self._indexed else await self._ready()
        with _translated():
            document = await entries.find_one({"_id": {"c": collection, "k": key}})
        return _row(document, _now_ms())

    async def _find(self, collection: str, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Fetched documents by key (expired ones included: callers filter)."""
        entries = await self._ready()
        found: dict[str, dict[str, Any]] = {}
        with _translated():
            for chunk in _chunks(keys):
                for document in await entries.find({"_id": {"$in": _ids(collection, chunk)}}).to_list(None):
                    found[document["_id"]["k"]] = document
        return found

    async def _get_many(self, collection: str, keys: Sequence[str]) -> list[str | None]:
        found = await self._find(collection, keys)
        now_ms = _now_ms()
        return [_text(found[key], now_ms) if key in found else None for key in keys]

    async def _ttl_many(self, collection: str, keys: Sequence[str]) -> list[tuple[str | None, float | None]]:
        found = await self._find(collection, keys)
        now_ms = _now_ms()
        return [_row(found.get(key), now_ms) for key in keys]

    async def _put(self, collection: str, key: str, text: str, ttl: float | None) -> None:
        entries = self._entries if self._indexed else await self._ready()
        with _translated():
            await entries.replace_one({"_id": {"c": collection, "k": key}}, self._document(text, ttl), upsert=True)

    async def _put_many(self, collection: str, keys: Sequence[str], texts: list[str], ttl: float | None) -> None:
        entries = await self._ready()
        with _translated():
            for start in range(0, len(keys), CHUNK_SIZE):
                requests = [
                    ReplaceOne({"_id": {"c": collection, "k": key}}, self._document(text, ttl), upsert=True)
                    for key, text in zip(keys[start : start + CHUNK_SIZE], texts[start : start + CHUNK_SIZE])
                ]
                await entries.bulk_write(requests, ordered=False)

    async def _delete(self, collection: str, key: str) -> bool:
        entries = await self._ready()
        with _translated():
            result = await entries.delete_one({"_id": {"c": collection, "k": key}, **_live(_now_ms())})
        return bool(result.deleted_count)

    async def _delete_many(self, collection: str, keys: Sequence[str]) -> int:
        entries = await self._ready()
        deleted = 0
        with _translated():
            for chunk in _chunks(keys):
                result = await entries.delete_many({"_id": {"$in": _ids(collection, chunk)}, **_live(_now_ms())})
                deleted += result.deleted_count
        return deleted

    async def _keys(self, collection: str, limit: int | None) -> list[str]:
        entries = await self._ready()
        with _translated():
            cursor = entries.find({"_id.c": collection, **_live(_now_ms())}, {"_id": 1}).limit(limit or 0)
            documents = await cursor.to_list(None)
        return [document["_id"]["k"] for document in documents]

    async def _collections(self, limit: int | None) -> list[str]:
        entries = await self._ready()
        pipeline: list[dict[str, Any]] = [
            {"$match": _live(_now_ms())},
            {"$group": {"_id": "$_id.c"}},
            {"$sort": {"_id": 1}},
        ]
        if limit is not None:
            pipeline.append({"$limit": limit})
        with _translated():
            cursor = entries.aggregate(pipeline)
            if inspect.isawaitable(cursor):  # pymongo's aggregate is a coroutine, motor's returns the cursor
                cursor = await cursor
            documents = await cursor.to_list(None)
        return [document["_id"] for document in documents]

    async def _destroy_where(self, where: dict[str, Any]) -> bool:
        entries = await self._ready()
        with _translated():
            live = await entries.delete_many({**where, **_live(_now_ms())})
            await entries.delete_many(where)
        return bool(live.deleted_count)

    async def _destroy_collection(self, collection: str) -> bool:
        return await self._destroy_where({"_id.c": collection})

    async def _destroy(self) -> bool:
        return await self._destroy_where({})

    async def _cull(self) -> None:
        entries = await self._ready()
        with _translated():
            await entries.delete_many({"e": {"$lte": DatetimeMS(_now_ms())}})
