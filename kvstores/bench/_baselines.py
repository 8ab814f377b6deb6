"""Baselines: each raw driver doing the same work as a kvstores store, and py-key-value-aio's stores.

A raw baseline is the fastest idiomatic use of its driver that keeps the same observable
behaviour — JSON values in and out, (collection, key) addressing, per-entry TTL with expired
entries invisible, bulk calls in one round trip, put_many all-or-nothing where the backend
can do it — and nothing else: no validation, no error translation, no lazy set-up beyond
opening the connection. It is the floor a store built on that driver can approach, not a
competitor. Each is defined here once, and named in its backend's row of
:data:`kvstores.bench._backends.BACKENDS`, which every row, sweep and target reads:

============  ==================  ===================================================================
family        name                calls
============  ==================  ===================================================================
memory        ``dict+json``       a plain dict of JSON text and monotonic expiry times
sqlite        ``aiosqlite``       one ``execute_fetchall`` per call (one hop to the connection's
                                  thread, the cursor finalised there), autocommit; put_many one
                                  multi-row INSERT; the atomic operations one statement each with
                                  ``RETURNING`` (a statement is its own transaction)
redis         ``redis.asyncio``   GET / SET PX / MGET / DEL, GET+PTTL pipelined, put_many one
                                  MULTI/EXEC pipeline, ``SET NX PX`` / ``GETDEL`` / GET then a
                                  Lua compare-and-set; a BlockingConnectionPool of the store's
                                  default size (50)
mongodb       ``pymongo``         AsyncMongoClient: find_one / replace_one(upsert=True) / find
                                  ``$in`` / one unordered bulk_write / delete_many ``$in``;
                                  insert_one / find_one_and_delete / find_one then
                                  find_one_and_update on the value read; the value stored as a
                                  native sub-document under a string ``_id``
postgresql    ``asyncpg``         a pool: fetchval / fetchrow / execute; ``= ANY($2)`` and
                                  ``unnest`` for bulk calls; INSERT ... ON CONFLICT, DELETE ...
                                  RETURNING, UPDATE ... WHERE value = the value read; expiry from
                                  the database clock
mysql         ``asyncmy``         a pool, prepared statements cached: one cursor.execute per call;
                                  ``IN (...)`` and one multi-row INSERT ... ON DUPLICATE KEY UPDATE
                                  for bulk calls; DELETE ... RETURNING (MariaDB), UPDATE ... WHERE
                                  value = the value read; expiry from the server clock
============  ==================  ===================================================================

py-key-value-aio's store on the same backend (``py-key-value``, opened by :func:`py_key_value`)
is the second baseline where it has one (memory, redis, mongodb, postgresql). Each raw baseline
keeps its data apart from the store's (its own table, key prefix or MongoDB collection) and
removes it in ``aclose()``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

__all__ = [
    "AiosqliteStore",
    "AsyncmyStore",
    "AsyncpgStore",
    "DictJsonStore",
    "PymongoStore",
    "RedisAsyncStore",
    "aiosqlite_beside",
    "libpq_url",
    "py_key_value",
    "redis_driver_url",
]

_RAW_NAME = "kvbench_raw"  # table, key prefix or MongoDB collection of the raw baselines
_REDIS_POOL_SIZE = 50  # RedisStore's default max_connections
_POSTGRESQL_POOL_SIZE = 10  # asyncpg's default max_size
_MYSQL_POOL_SIZE = 10  # MySQLStore's default max_connections (asyncmy's default maxsize)
_LIBPQ_OPTIONS = frozenset({"sslmode", "sslcert", "sslkey", "sslrootcert", "sslpassword", "passfile"})
"""Query options a kvstores PostgreSQL URL may carry that asyncpg understands (the others are kvstores')."""

Value = dict[str, Any]
Update = Callable[[Value | None], Mapping[str, Any] | None]


def _expires(ttl: float | None, clock: float) -> float | None:
    return None if ttl is None else clock + ttl


_REDIS_STORE_OPTIONS = frozenset({"prefix", "timeout", "max_connections", "default_collection"})


def _keep_query(url: str, keep: Callable[[str], bool]) -> str:
    """``url`` with only the query options ``keep`` accepts (the others are kvstores' own)."""
    parts = urlsplit(url)
    query = urlencode([(name, value) for name, value in parse_qsl(parts.query) if keep(name)])
    return urlunsplit(parts._replace(query=query))


class DictJsonStore:
    """The floor for memory: a dict of JSON text and monotonic expiry times."""

    def __init__(self) -> None:
        self._data: dict[tuple[str | None, str], tuple[str, float | None]] = {}

    def _live(self, collection: str | None, key: str, now: float) -> tuple[str, float | None] | None:
        entry = self._data.get((collection, key))
        return None if entry is None or (entry[1] is not None and entry[1] <= now) else entry

    async def get(self, key: str, *, collection: str | None = None) -> Value | None:
        """The value of ``key``, or None."""
        entry = self._live(collection, key, time.monotonic())
        return None if entry is None else json.loads(entry[0])

    async def ttl(self, key: str, *, collection: str | None = None) -> tuple[Value | None, float | None]:
        """The value and remaining seconds of ``key``."""
        now = time.monotonic()
        entry = self._live(collection, key, now)
        if entry is None:
            return None, None
        return json.loads(entry[0]), None if entry[1] is None else entry[1] - now

    async def put(
        self, key: str, value: Mapping[str, Any], *, collection: str | None = None, ttl: float | None = None
    ) -> None:
        """Store ``value``."""
        self._data[collection, key] = (json.dumps(value), _expires(ttl, time.monotonic()))

    async def get_many(self, keys: Sequence[str], *, collection: str | None = None) -> list[Value | None]:
        """The values of ``keys``."""
        now = time.monotonic()
        entries = [self._live(collection, key, now) for key in keys]
        return [None if entry is None else json.loads(entry[0]) for entry in entries]

    async def put_many(
        self,
        keys: Sequence[str],
        values: Sequence[Mapping[str, Any]],
        *,
        collection: str | None = None,
        ttl: float | None = None,
    ) -> None:
        """Store each value under its key."""
        expires = _expires(ttl, time.monotonic())
        for key, value in zip(keys, values):
            self._data[collection, key] = (json.dumps(value), expires)

    async def delete_many(self, keys: Sequence[str], *, collection: str | None = None) -> int:
        """Delete ``keys``; return how many existed."""
        now = time.monotonic()
        live = [key for key in keys if self._live(collection, key, now) is not None]
        for key in live:
            del self._data[collection, key]
        return len(live)

    async def put_if_absent(
        self, key: str, value: Mapping[str, Any], *, collection: str | None = None, ttl: float | None = None
    ) -> bool:
        """Store ``value`` unless ``key`` holds a live entry; True if stored."""
        now = time.monotonic()
        if self._live(collection, key, now) is not None:
            return False
        self._data[collection, key] = (json.dumps(value), _expires(ttl, now))
        return True

    async def pop(self, key: str, *, collection: str | None = None) -> Value | None:
        """Delete ``key`` and return its value, or None."""
        entry = self._live(collection, key, time.monotonic())
        if entry is None:
            return None
        del self._data[collection, key]
        value: Value = json.loads(entry[0])
        return value

    async def update(
        self, key: str, fn: Update, *, collection: str | None = None, ttl: float | None = None
    ) -> Value | None:
        """Store ``fn(value)`` (delete on None); return what was stored."""
        now = time.monotonic()
        entry = self._live(collection, key, now)
        new = fn(None if entry is None else json.loads(entry[0]))
        if new is None:
            self._data.pop((collection, key), None)
            return None
        self._data[collection, key] = (json.dumps(new), _expires(ttl, now))
        return dict(new)

    async def aclose(self) -> None:
        """Forget everything."""
        self._data.clear()


class AiosqliteStore:
    """Raw aiosqlite: the store's schema and pragmas in a file of its own, one ``execute_fetchall`` per call.

    A file of its own, beside the store's, so that neither pays for the other's WAL checkpoints.
    """

    _LIVE = "(expires_at IS NULL OR expires_at > ?)"
    _CLAIM = (  # insert, or take over an expired entry; returns a row only if it wrote
        f"INSERT INTO {_RAW_NAME} VALUES (?, ?, ?, ?) ON CONFLICT (collection, key) DO UPDATE"
        " SET value = excluded.value, expires_at = excluded.expires_at"
        f" WHERE {_RAW_NAME}.expires_at IS NOT NULL AND {_RAW_NAME}.expires_at <= ? RETURNING 1"
    )

    def __init__(self, path: str) -> None:
        self._path = path
        self._db: Any = None

    async def _connection(self) -> Any:
        if self._db is None:
            import aiosqlite

            self._db = await aiosqlite.connect(self._path, isolation_level=None)
            await self._db.execute_fetchall("PRAGMA journal_mode = WAL")
            await self._db.execute_fetchall("PRAGMA synchronous = NORMAL")
            await self._db.execute_fetchall(
                f"CREATE TABLE IF NOT EXISTS {_RAW_NAME} (collection TEXT NOT NULL, key TEXT NOT NULL,"
                " value TEXT NOT NULL, expires_at REAL, PRIMARY KEY (collection, key)) WITHOUT ROWID"
            )
        return self._db

    async def _run(self, sql: str, parameters: Sequence[Any]) -> Any:
        db = self._db or await self._connection()
        return await db.execute_fetchall(sql, parameters)

    async def get(self, key: str, *, collection: str | None = None) -> Value | None:
        """The value of ``key``, or None."""
        rows = await self._run(
            f"SELECT value FROM {_RAW_NAME} WHERE collection = ? AND key = ? AND {self._LIVE}",
            (collection, key, time.time()),
        )
        return json.loads(rows[0][0]) if rows else None

    async def ttl(self, key: str, *, collection: str | None = None) -> tuple[Value | None, float | None]:
        """The value and remaining seconds of ``key``."""
        now = time.time()
        rows = await self._run(
            f"SELECT value, expires_at FROM {_RAW_NAME} WHERE collection = ? AND key = ? AND {self._LIVE}",
            (collection, key, now),
        )
        if not rows:
            return None, None
        value, expires_at = rows[0]
        return json.loads(value), None if expires_at is None else expires_at - now

    async def put(
        self, key: str, value: Mapping[str, Any], *, collection: str | None = None, ttl: float | None = None
    ) -> None:
        """Store ``value`` (one autocommit statement)."""
        await self._run(
            f"INSERT OR REPLACE INTO {_RAW_NAME} VALUES (?, ?, ?, ?)",
            (collection, key, json.dumps(value), _expires(ttl, time.time())),
        )

    async def get_many(self, keys: Sequence[str], *, collection: str | None = None) -> list[Value | None]:
        """The values of ``keys`` (one SELECT ... IN)."""
        rows = await self._run(
            f"SELECT key, value FROM {_RAW_NAME} WHERE collection = ? AND key IN ({','.join('?' * len(keys))})"
            f" AND {self._LIVE}",
            (collection, *keys, time.time()),
        )
        found = dict(rows)
        return [json.loads(found[key]) if key in found else None for key in keys]

    async def put_many(
        self,
        keys: Sequence[str],
        values: Sequence[Mapping[str, Any]],
        *,
        collection: str | None = None,
        ttl: float | None = None,
    ) -> None:
        """Store each value under its key (one multi-row INSERT: one statement, one transaction)."""
        expires = _expires(ttl, time.time())
        parameters = [
            item for key, value in zip(keys, values) for item in (collection, key, json.dumps(value), expires)
        ]
        await self._run(
            f"INSERT OR REPLACE INTO {_RAW_NAME} VALUES {','.join(['(?, ?, ?, ?)'] * len(keys))}", parameters
        )

    async def delete_many(self, keys: Sequence[str], *, collection: str | None = None) -> int:
        """Delete ``keys`` (one DELETE ... IN); return how many existed."""
        rows = await self._run(
            f"DELETE FROM {_RAW_NAME} WHERE collection = ? AND key IN ({','.join('?' * len(keys))}) AND {self._LIVE}"
            " RETURNING 1",
            (collection, *keys, time.time()),
        )
        return len(rows)

    async def put_if_absent(
        self, key: str, value: Mapping[str, Any], *, collection: str | None = None, ttl: float | None = None
    ) -> bool:
        """Store ``value`` unless ``key`` holds a live entry (one INSERT ... ON CONFLICT); True if stored."""
        now = time.time()
        return bool(await self._run(self._CLAIM, (collection, key, json.dumps(value), _expires(ttl, now), now)))

    async def pop(self, key: str, *, collection: str | None = None) -> Value | None:
        """Delete ``key`` and return its value, or None (one DELETE ... RETURNING)."""
        now = time.time()
        rows = await self._run(
            f"DELETE FROM {_RAW_NAME} WHERE collection = ? AND key = ? RETURNING value, expires_at", (collection, key)
        )
        if not rows or (rows[0][1] is not None and rows[0][1] <= now):
            return None
        value: Value = json.loads(rows[0][0])
        return value

    async def update(
        self, key: str, fn: Update, *, collection: str | None = None, ttl: float | None = None
    ) -> Value | None:
        """Read, apply ``fn``, write only if the stored text is still the one read; retry otherwise."""
        while True:
            now = time.time()
            rows = await self._run(
                f"SELECT value FROM {_RAW_NAME} WHERE collection = ? AND key = ? AND {self._LIVE}",
                (collection, key, now),
            )
            old = rows[0][0] if rows else None
            new = fn(None if old is None else json.loads(old))
            text = None if new is None else json.dumps(new)
            if old is None and text is None:
                return None
            if old is None:
                written = await self._run(self._CLAIM, (collection, key, text, _expires(ttl, now), now))
            elif text is None:
                written = await self._run(
                    f"DELETE FROM {_RAW_NAME} WHERE collection = ? AND key = ? AND value = ? RETURNING 1",
                    (collection, key, old),
                )
            else:
                written = await self._run(
                    f"UPDATE {_RAW_NAME} SET value = ?, expires_at = ? WHERE collection = ? AND key = ? AND value = ?"
                    f" AND {self._LIVE} RETURNING 1",
                    (text, _expires(ttl, now), collection, key, old, now),
                )
            if written:
                return None if new is None else dict(new)

    async def aclose(self) -> None:
        """Close the connection and delete the baseline's file."""
        if self._db is not None:
            await self._db.close()
        if self._path != ":memory:":
            await asyncio.to_thread(self._remove_files)

    def _remove_files(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(self._path + suffix).unlink(missing_ok=True)


_REDIS_CAS = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1])
elseif ARGV[3] == '' then redis.call('SET', KEYS[1], ARGV[2])
else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
return 1
"""


class RedisAsyncStore:
    """Raw redis.asyncio: one command (or one pipeline) per call on a blocking connection pool."""

    def __init__(self, url: str) -> None:
        from redis.asyncio import BlockingConnectionPool, Redis

        pool = BlockingConnectionPool.from_url(redis_driver_url(url), max_connections=_REDIS_POOL_SIZE)
        self._client: Any = Redis(connection_pool=pool)
        self._cas: Any = self._client.register_script(_REDIS_CAS)

    @staticmethod
    def _name(collection: str | None, key: str) -> str:
        return f"{_RAW_NAME}:{collection}:{key}"

    @staticmethod
    def _px(ttl: float | None) -> int | None:
        return None if ttl is None else int(ttl * 1000)

    async def get(self, key: str, *, collection: str | None = None) -> Value | None:
        """The value of ``key``, or None."""
        raw = await self._client.get(self._name(collection, key))
        return None if raw is None else json.loads(raw)

    async def ttl(self, key: str, *, collection: str | None = None) -> tuple[Value | None, float | None]:
        """The value and remaining seconds of ``key``."""
        name = self._name(collection, key)
        raw, milliseconds = await self._client.pipeline(transaction=False).get(name).pttl(name).execute()
        if raw is None:
            return None, None
        return json.loads(raw), None if milliseconds < 0 else milliseconds / 1000

    async def put(
        self, key: str, value: Mapping[str, Any], *, collection: str | None = None, ttl: float | None = None
    ) -> None:
        """Store ``value``."""
        await self._client.set(self._name(collection, key), json.dumps(value), px=self._px(ttl))

    async def get_many(self, keys: Sequence[str], *, collection: str | None = None) -> list[Value | None]:
        """The values of ``keys`` (one MGET)."""
        raws = await self._client.mget([self._name(collection, key) for key in keys])
        return [None if raw is None else json.loads(raw) for raw in raws]

    async def put_many(
        self,
        keys: Sequence[str],
        values: Sequence[Mapping[str, Any]],
        *,
        collection: str | None = None,
        ttl: float | None = None,
    ) -> None:
        """Store each value under its key (one MULTI/EXEC pipeline)."""
        px = self._px(ttl)
        pipe = self._client.pipeline(transaction=True)
        for key, value in zip(keys, values):
            pipe.set(self._name(collection, key), json.dumps(value), px=px)
        await pipe.execute()

    async def delete_many(self, keys: Sequence[str], *, collection: str | None = None) -> int:
        """Delete ``keys`` (one DEL); return how many existed."""
        return int(await self._client.delete(*(self._name(collection, key) for key in keys)))

    async def put_if_absent(
        self, key: str, value: Mapping[str, Any], *, collection: str | None = None, ttl: float | None = None
    ) -> bool:
        """Store ``value`` unless ``key`` exists (SET NX PX); True if stored."""
        return bool(await self._client.set(self._name(collection, key), json.dumps(value), px=self._px(ttl), nx=True))

    async def pop(self, key: str, *, collection: str | None = None) -> Value | None:
        """Delete ``key`` and return its value, or None (GETDEL)."""
        raw = await self._client.getdel(self._name(collection, key))
        return None if raw is None else json.loads(raw)

    async def update(
        self, key: str, fn: Update, *, collection: str | None = None, ttl: float | None = None
    ) -> Value | None:
        """GET, apply ``fn``, then a Lua compare-and-set (SET NX when absent); retry on conflict."""
        name = self._name(collection, key)
        while True:
            old = await self._client.get(name)
            new = fn(None if old is None else json.loads(old))
            text = "" if new is None else json.dumps(new)
            if old is None:
                written = new is None or await self._client.set(name, text, px=self._px(ttl), nx=True)
            else:
                px = self._px(ttl)
                written = await self._cas(keys=[name], args=[old, text, "" if px is None else px])
            if written:
                return None if new is None else dict(new)

    async def aclose(self) -> None:
        """Delete the baseline's keys and close the client."""
        names = [name async for name in self._client.scan_iter(match=f"{_RAW_NAME}:*", count=1000)]
        for start in range(0, len(names), 1000):
            await self._client.delete(*names[start : start + 1000])
        await self._client.aclose()


class PymongoStore:
    """Raw pymongo async: one document per entry, ``_id`` the string ``collection:key``, the value native."""

    def __init__(self, url: str) -> None:
        from pymongo import AsyncMongoClient

        self._client: Any = AsyncMongoClient(url)
        self._entries: Any = self._client.get_default_database("kvbench")[_RAW_NAME]

    @staticmethod
    def _expired(document: dict[str, Any]) -> bool:
        return "e" in document and document["e"] <= time.time()

    @staticmethod
    def _document(value: Mapping[str, Any], ttl: float | None) -> dict[str, Any]:
        return {"v": value} if ttl is None else {"v": value, "e": time.time() + ttl}

    async def get(self, key: str, *, collection: str | None = None) -> Value | None:
        """The value of ``key``, or None."""
        document = await self._entries.find_one({"_id": f"{collection}:{key}"})
        return None if document is None or self._expired(document) else document["v"]

    async def ttl(self, key: str, *, collection: str | None = None) -> tuple[Value | None, float | None]:
        """The value and remaining seconds of ``key``."""
        document = await self._entries.find_one({"_id": f"{collection}:{key}"})
        if document is None or self._expired(document):
            return None, None
        return document["v"], document["e"] - time.time() if "e" in document else None

    async def put(
        self, key: str, value: Mapping[str, Any], *, collection: str | None = None, ttl: float | None = None
    ) -> None:
        """Store ``value`` (one upserting replace)."""
        await self._entries.replace_one({"_id": f"{collection}:{key}"}, self._document(value, ttl), upsert=True)

    async def get_many(self, keys: Sequence[str], *, collection: str | None = None) -> list[Value | None]:
        """The values of ``keys`` (one find with $in)."""
        documents = await self._entries.find({"_id": {"$in": [f"{collection}:{key}" for key in keys]}}).to_list()
        found = {document["_id"]: document for document in documents if not self._expired(document)}
        return [found[f"{collection}:{key}"]["v"] if f"{collection}:{key}" in found else None for key in keys]

    async def put_many(
        self,
        keys: Sequence[str],
        values: Sequence[Mapping[str, Any]],
        *,
        collection: str | None = None,
        ttl: float | None = None,
    ) -> None:
        """Store each value under its key (one unordered bulk_write)."""
        from pymongo import ReplaceOne

        await self._entries.bulk_write(
            [
                ReplaceOne({"_id": f"{collection}:{key}"}, self._document(value, ttl), upsert=True)
                for key, value in zip(keys, values)
            ],
            ordered=False,
        )

    async def delete_many(self, keys: Sequence[str], *, collection: str | None = None) -> int:
        """Delete ``keys`` (one delete_many with $in); return how many existed."""
        result = await self._entries.delete_many({"_id": {"$in": [f"{collection}:{key}" for key in keys]}})
        return int(result.deleted_count)

    async def put_if_absent(
        self, key: str, value: Mapping[str, Any], *, collection: str | None = None, ttl: float | None = None
    ) -> bool:
        """Store ``value`` unless ``key`` holds a live entry (insert_one; an expired one is replaced)."""
        from pymongo.errors import DuplicateKeyError

        document = self._document(value, ttl)
        try:
            await self._entries.insert_one({"_id": f"{collection}:{key}", **document})
        except DuplicateKeyError:
            expired = {"_id": f"{collection}:{key}", "e": {"$lte": time.time()}}
            return bool((await self._entries.replace_one(expired, document)).modified_count)
        return True

    async def pop(self, key: str, *, collection: str | None = None) -> Value | None:
        """Delete ``key`` and return its value, or None (find_one_and_delete)."""
        document = await self._entries.find_one_and_delete({"_id": f"{collection}:{key}"})
        return None if document is None or self._expired(document) else document["v"]

    async def update(
        self, key: str, fn: Update, *, collection: str | None = None, ttl: float | None = None
    ) -> Value | None:
        """find_one, apply ``fn``, then find_one_and_update on the value read; retry on conflict."""
        id_ = f"{collection}:{key}"
        while True:
            document = await self._entries.find_one({"_id": id_})
            old = None if document is None or self._expired(document) else document["v"]
            new = fn(old)
            if old is None:
                written = new is None or await self.put_if_absent(key, new, collection=collection, ttl=ttl)
            elif new is None:
                written = (await self._entries.delete_one({"_id": id_, "v": old})).deleted_count
            else:
                change = {"$set": self._document(new, ttl)} | ({"$unset": {"e": ""}} if ttl is None else {})
                written = await self._entries.find_one_and_update(
                    {"_id": id_, "v": old}, change, projection={"_id": True}
                )
            if written:
                return None if new is None else dict(new)

    async def aclose(self) -> None:
        """Drop the baseline's collection and close the client."""
        await self._entries.drop()
        await self._client.close()


class AsyncpgStore:
    """Raw asyncpg: one statement per call on a pool, arrays for bulk calls, expiry by the database clock."""

    _LIVE = "(expires_at IS NULL OR expires_at > now())"
    _EXPIRES = "now() + $4::float8 * interval '1 second'"
    _CLAIM = (  # insert, or take over an expired entry; returns a row only if it wrote
        f"INSERT INTO {_RAW_NAME} VALUES ($1, $2, $3, {_EXPIRES}) ON CONFLICT (collection, key) DO UPDATE"
        " SET value = excluded.value, expires_at = excluded.expires_at"
        f" WHERE {_RAW_NAME}.expires_at <= now() RETURNING 1"
    )

    def __init__(self, url: str) -> None:
        self._url = libpq_url(url)
        self._pool: Any = None
        self._opening = asyncio.Lock()

    async def _connection(self) -> Any:
        async with self._opening:
            if self._pool is None:
                import asyncpg

                pool = await asyncpg.create_pool(self._url, min_size=1, max_size=_POSTGRESQL_POOL_SIZE)
                await pool.execute(
                    f"CREATE TABLE IF NOT EXISTS {_RAW_NAME} (collection text NOT NULL, key text NOT NULL,"
                    " value text NOT NULL, expires_at timestamptz, PRIMARY KEY (collection, key))"
                )
                self._pool = pool
        return self._pool

    async def get(self, key: str, *, collection: str | None = None) -> Value | None:
        """The value of ``key``, or None."""
        pool = self._pool or await self._connection()
        text = await pool.fetchval(
            f"SELECT value FROM {_RAW_NAME} WHERE collection = $1 AND key = $2 AND {self._LIVE}", collection, key
        )
        return None if text is None else json.loads(text)

    async def ttl(self, key: str, *, collection: str | None = None) -> tuple[Value | None, float | None]:
        """The value and remaining seconds of ``key``."""
        pool = self._pool or await self._connection()
        row = await pool.fetchrow(
            f"SELECT value, extract(epoch FROM expires_at - now())::float8 FROM {_RAW_NAME}"
            f" WHERE collection = $1 AND key = $2 AND {self._LIVE}",
            collection,
            key,
        )
        return (None, None) if row is None else (json.loads(row[0]), row[1])

    async def put(
        self, key: str, value: Mapping[str, Any], *, collection: str | None = None, ttl: float | None = None
    ) -> None:
        """Store ``value`` (one upserting INSERT)."""
        pool = self._pool or await self._connection()
        await pool.execute(
            f"INSERT INTO {_RAW_NAME} VALUES ($1, $2, $3, {self._EXPIRES}) ON CONFLICT (collection, key)"
            " DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at",
            collection,
            key,
            json.dumps(value),
            ttl,
        )

    async def get_many(self, keys: Sequence[str], *, collection: str | None = None) -> list[Value | None]:
        """The values of ``keys`` (one SELECT ... = ANY($2))."""
        pool = self._pool or await self._connection()
        rows = await pool.fetch(
            f"SELECT key, value FROM {_RAW_NAME} WHERE collection = $1 AND key = ANY($2::text[]) AND {self._LIVE}",
            collection,
            list(keys),
        )
        found = {row[0]: row[1] for row in rows}
        return [json.loads(found[key]) if key in found else None for key in keys]

    async def put_many(
        self,
        keys: Sequence[str],
        values: Sequence[Mapping[str, Any]],
        *,
        collection: str | None = None,
        ttl: float | None = None,
    ) -> None:
        """Store each value under its key (one INSERT ... SELECT FROM unnest: one statement)."""
        pool = self._pool or await self._connection()
        await pool.execute(
            f"INSERT INTO {_RAW_NAME} SELECT $1, k, v, {self._EXPIRES} FROM unnest($2::text[], $3::text[]) AS u(k, v)"
            " ON CONFLICT (collection, key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at",
            collection,
            list(keys),
            [json.dumps(value) for value in values],
            ttl,
        )

    async def delete_many(self, keys: Sequence[str], *, collection: str | None = None) -> int:
        """Delete ``keys`` (one DELETE ... = ANY($2)); return how many existed."""
        pool = self._pool or await self._connection()
        status = await pool.execute(
            f"DELETE FROM {_RAW_NAME} WHERE collection = $1 AND key = ANY($2::text[]) AND {self._LIVE}",
            collection,
            list(keys),
        )
        return int(status.rpartition(" ")[2])

    async def put_if_absent(
        self, key: str, value: Mapping[str, Any], *, collection: str | None = None, ttl: float | None = None
    ) -> bool:
        """Store ``value`` unless ``key`` holds a live entry (INSERT ... ON CONFLICT); True if stored."""
        pool = self._pool or await self._connection()
        return await pool.fetchval(self._CLAIM, collection, key, json.dumps(value), ttl) is not None

    async def pop(self, key: str, *, collection: str | None = None) -> Value | None:
        """Delete ``key`` and return its value, or None (DELETE ... RETURNING)."""
        pool = self._pool or await self._connection()
        row = await pool.fetchrow(
            f"DELETE FROM {_RAW_NAME} WHERE collection = $1 AND key = $2 RETURNING value, {self._LIVE}",
            collection,
            key,
        )
        return None if row is None or not row[1] else json.loads(row[0])

    async def update(
        self, key: str, fn: Update, *, collection: str | None = None, ttl: float | None = None
    ) -> Value | None:
        """SELECT, apply ``fn``, then UPDATE ... WHERE value = the text read; retry on conflict."""
        pool = self._pool or await self._connection()
        while True:
            old = await pool.fetchval(
                f"SELECT value FROM {_RAW_NAME} WHERE collection = $1 AND key = $2 AND {self._LIVE}", collection, key
            )
            new = fn(None if old is None else json.loads(old))
            text = None if new is None else json.dumps(new)
            if old is None:
                written = text is None or await pool.fetchval(self._CLAIM, collection, key, text, ttl) is not None
            elif text is None:
                status = await pool.execute(
                    f"DELETE FROM {_RAW_NAME} WHERE collection = $1 AND key = $2 AND value = $3", collection, key, old
                )
                written = status != "DELETE 0"
            else:
                status = await pool.execute(
                    f"UPDATE {_RAW_NAME} SET value = $3, expires_at = {self._EXPIRES}"
                    f" WHERE collection = $1 AND key = $2 AND value = $5 AND {self._LIVE}",
                    collection,
                    key,
                    text,
                    ttl,
                    old,
                )
                written = status != "UPDATE 0"
            if written:
                return None if new is None else dict(new)

    async def aclose(self) -> None:
        """Drop the baseline's table and close the pool."""
        if self._pool is not None:
            await self._pool.execute(f"DROP TABLE IF EXISTS {_RAW_NAME}")
            await self._pool.close()


class AsyncmyStore:
    """Raw asyncmy (MariaDB/MySQL): one statement per call on a pool, ``IN (...)`` and multi-row VALUES for
    bulk calls, expiry by the server clock; prepared statements cached as the store's are (128 a connection)."""

    _LIVE = "(expires_at IS NULL OR expires_at > UTC_TIMESTAMP(6))"
    _EXPIRES = "UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND"
    _UPSERT = " ON DUPLICATE KEY UPDATE value = VALUES(value), expires_at = VALUES(expires_at)"
    _CLAIM = (  # insert, or take over an expired entry; 0 rows changed when a live entry stays
        f"INSERT INTO {_RAW_NAME} VALUES (%s, %s, %s, {_EXPIRES}) ON DUPLICATE KEY UPDATE"
        " value = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(value), value),"
        " expires_at = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(expires_at), expires_at)"
    )

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._options: dict[str, Any] = {
            "host": parts.hostname or "localhost",
            "port": parts.port or 3306,
            "user": unquote(parts.username or "") or None,
            "password": unquote(parts.password or ""),
            "database": unquote(parts.path.lstrip("/")) or None,
            "autocommit": True,
            "charset": "utf8mb4",
            "stmt_cache_size": 128,
            "minsize": 1,
            "maxsize": _MYSQL_POOL_SIZE,
        }
        self._pool: Any = None
        self._opening = asyncio.Lock()

    async def _connection(self) -> Any:
        async with self._opening:
            if self._pool is None:
                import asyncmy

                pool = await asyncmy.create_pool(**self._options)
                async with pool.acquire() as connection, connection.cursor() as cursor:
                    await cursor.execute(
                        f"CREATE TABLE IF NOT EXISTS {_RAW_NAME} (collection VARBINARY(255) NOT NULL,"
                        " `key` VARBINARY(255) NOT NULL, value LONGTEXT CHARACTER SET utf8mb4 NOT NULL,"
                        " expires_at DATETIME(6) NULL, PRIMARY KEY (collection, `key`)) ENGINE=InnoDB"
                    )
                self._pool = pool
        return self._pool

    async def _run(self, sql: str, args: Sequence[Any]) -> tuple[int, Sequence[Any]]:
        pool = self._pool or await self._connection()
        async with pool.acquire() as connection, connection.cursor() as cursor:
            count: int = await cursor.execute(sql, args)
            return count, await cursor.fetchall() if cursor.description else ()

    @staticmethod
    def _micros(ttl: float | None) -> int | None:
        return None if ttl is None else round(ttl * 1_000_000)

    async def get(self, key: str, *, collection: str | None = None) -> Value | None:
        """The value of ``key``, or None."""
        _, rows = await self._run(
            f"SELECT value FROM {_RAW_NAME} WHERE collection = %s AND `key` = %s AND {self._LIVE}", (collection, key)
        )
        return json.loads(rows[0][0]) if rows else None

    async def ttl(self, key: str, *, collection: str | None = None) -> tuple[Value | None, float | None]:
        """The value and remaining seconds of ``key``."""
        _, rows = await self._run(
            f"SELECT value, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) FROM {_RAW_NAME}"
            f" WHERE collection = %s AND `key` = %s AND {self._LIVE}",
            (collection, key),
        )
        if not rows:
            return None, None
        return json.loads(rows[0][0]), None if rows[0][1] is None else rows[0][1] / 1e6

    async def put(
        self, key: str, value: Mapping[str, Any], *, collection: str | None = None, ttl: float | None = None
    ) -> None:
        """Store ``value`` (one upserting INSERT)."""
        await self._run(
            f"INSERT INTO {_RAW_NAME} VALUES (%s, %s, %s, {self._EXPIRES}){self._UPSERT}",
            (collection, key, json.dumps(value), self._micros(ttl)),
        )

    async def get_many(self, keys: Sequence[str], *, collection: str | None = None) -> list[Value | None]:
        """The values of ``keys`` (one SELECT ... IN)."""
        _, rows = await self._run(
            f"SELECT `key`, value FROM {_RAW_NAME} WHERE collection = %s AND `key` IN ({', '.join(['%s'] * len(keys))})"
            f" AND {self._LIVE}",
            (collection, *keys),
        )
        found = {key.decode(): value for key, value in rows}
        return [json.loads(found[key]) if key in found else None for key in keys]

    async def put_many(
        self,
        keys: Sequence[str],
        values: Sequence[Mapping[str, Any]],
        *,
        collection: str | None = None,
        ttl: float | None = None,
    ) -> None:
        """Store each value under its key (one multi-row INSERT: one statement)."""
        micros = self._micros(ttl)
        args: list[Any] = []
        for key, value in zip(keys, values):
            args += (collection, key, json.dumps(value), micros)
        rows = ", ".join([f"(%s, %s, %s, {self._EXPIRES})"] * len(keys))
        await self._run(f"INSERT INTO {_RAW_NAME} VALUES {rows}{self._UPSERT}", args)

    async def delete_many(self, keys: Sequence[str], *, collection: str | None = None) -> int:
        """Delete ``keys`` (one DELETE ... IN); return how many existed."""
        count, _ = await self._run(
            f"DELETE FROM {_RAW_NAME} WHERE collection = %s AND `key` IN ({', '.join(['%s'] * len(keys))})"
            f" AND {self._LIVE}",
            (collection, *keys),
        )
        return count

    async def put_if_absent(
        self, key: str, value: Mapping[str, Any], *, collection: str | None = None, ttl: float | None = None
    ) -> bool:
        """Store ``value`` unless ``key`` holds a live entry (INSERT ... ON DUPLICATE KEY UPDATE); True if stored."""
        count, _ = await self._run(self._CLAIM, (collection, key, json.dumps(value), self._micros(ttl)))
        return count > 0

    async def pop(self, key: str, *, collection: str | None = None) -> Value | None:
        """Delete ``key`` and return its value, or None (MariaDB's DELETE ... RETURNING)."""
        _, rows = await self._run(
            f"DELETE FROM {_RAW_NAME} WHERE collection = %s AND `key` = %s AND {self._LIVE} RETURNING value",
            (collection, key),
        )
        return json.loads(rows[0][0]) if rows else None

    async def update(
        self, key: str, fn: Update, *, collection: str | None = None, ttl: float | None = None
    ) -> Value | None:
        """SELECT, apply ``fn``, then UPDATE ... WHERE value = the text read; retry on conflict."""
        while True:
            _, rows = await self._run(
                f"SELECT value FROM {_RAW_NAME} WHERE collection = %s AND `key` = %s AND {self._LIVE}",
                (collection, key),
            )
            old = rows[0][0] if rows else None
            new = fn(None if old is None else json.loads(old))
            text = None if new is None else json.dumps(new)
            if old is None:
                written = (
                    text is None or (await self._run(self._CLAIM, (collection, key, text, self._micros(ttl))))[0] > 0
                )
            elif text is None:
                sql = f"DELETE FROM {_RAW_NAME} WHERE collection = %s AND `key` = %s AND value = %s"
                written = (await self._run(sql, (collection, key, old)))[0] > 0
            else:
                sql = (
                    f"UPDATE {_RAW_NAME} SET value = %s, expires_at = {self._EXPIRES}"
                    f" WHERE collection = %s AND `key` = %s AND value = %s AND {self._LIVE}"
                )
                changed = (await self._run(sql, (text, self._micros(ttl), collection, key, old)))[0]
                written = changed > 0 or (text == old and ttl is None)  # MySQL counts changed rows only
            if written:
                return None if new is None else dict(new)

    async def aclose(self) -> None:
        """Drop the baseline's table and close the pool."""
        if self._pool is not None:
            await self._run(f"DROP TABLE IF EXISTS {_RAW_NAME}", ())
            self._pool.close()
            await self._pool.wait_closed()


def aiosqlite_beside(url: str, store: Any) -> AiosqliteStore | None:
    """The raw aiosqlite baseline in a file beside ``store``'s (None for a store with no path)."""
    path = getattr(store, "path", None)
    if path is None:
        return None
    return AiosqliteStore(path if path == ":memory:" else f"{path}.{_RAW_NAME}")


def py_key_value(class_path: str, **options: Any) -> Any:
    """py-key-value-aio's store ``module:Class`` (in ``key_value.aio.stores``), or None when not installed."""
    module_name, _, class_name = class_path.partition(":")
    try:
        module = importlib.import_module(f"key_value.aio.stores.{module_name}")
    except ImportError:
        return None
    return getattr(module, class_name)(**options)


def redis_driver_url(url: str) -> str:
    """A kvstores Redis ``url`` without the query options only kvstores' RedisStore reads (redis.asyncio's)."""
    return _keep_query(url, lambda name: name not in _REDIS_STORE_OPTIONS)


def libpq_url(url: str) -> str:
    """A kvstores PostgreSQL ``url`` with only the query options asyncpg understands."""
    return _keep_query(url, _LIBPQ_OPTIONS.__contains__)
