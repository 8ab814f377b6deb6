"""Baselines: each raw driver doing the same work as a kvstores store, and py-key-value-aio's stores.

A raw baseline is the least code that keeps the same observable behaviour — JSON values
in and out, (collection, key) addressing, per-entry TTL with expired entries invisible,
bulk calls in one round trip (one transaction for put_many where the backend has them) —
and nothing else: no validation, no error translation, no lazy set-up. It is the floor a
store built on that driver can approach. Each baseline keeps its data apart from the
store's (its own table, key prefix or MongoDB collection) and removes it in ``aclose()``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["baselines", "family"]

_RAW_NAME = "kvbench_raw"  # table, key prefix or MongoDB collection of the raw baselines


def family(url: str) -> str:
    """The backend a store URL opens: memory, sqlite, redis, mongodb, or the scheme itself."""
    from kvstores.registry import SCHEMES

    scheme = url.partition("://")[0].lower()
    target = SCHEMES.get(scheme, "")
    return target.split(":")[0].rpartition(".")[2] or scheme


def _expires(ttl: float | None, clock: float) -> float | None:
    return None if ttl is None else clock + ttl


class DictJsonStore:
    """The floor for memory: a dict of JSON text and monotonic expiry times."""

    def __init__(self) -> None:
        self._data: dict[tuple[str | None, str], tuple[str, float | None]] = {}

    def _live(self, collection: str | None, key: str, now: float) -> tuple[str, float | None] | None:
        entry = self._data.get((collection, key))
        return None if entry is None or (entry[1] is not None and entry[1] <= now) else entry

    async def get(self, key: str, *, collection: str | None = None) -> dict[str, Any] | None:
        """The value of ``key``, or None."""
        entry = self._live(collection, key, time.monotonic())
        return None if entry is None else json.loads(entry[0])

    async def ttl(self, key: str, *, collection: str | None = None) -> tuple[dict[str, Any] | None, float | None]:
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

    async def get_many(self, keys: Sequence[str], *, collection: str | None = None) -> list[dict[str, Any] | None]:
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

    async def aclose(self) -> None:
        """Forget everything."""
        self._data.clear()


class AiosqliteStore:
    """Raw aiosqlite: the store's schema and pragmas in a file of its own, one statement per call.

    A file of its own, beside the store's, so that neither pays for the other's WAL checkpoints.
    """

    _LIVE = "(expires_at IS NULL OR expires_at > ?)"

    def __init__(self, path: str) -> None:
        self._path = path
        self._db: Any = None
        self._lock = asyncio.Lock()  # put_many's transaction must not interleave with another

    async def _connection(self) -> Any:
        if self._db is None:
            import aiosqlite

            self._db = await aiosqlite.connect(self._path, isolation_level=None)
            await self._db.execute("PRAGMA journal_mode = WAL")
            await self._db.execute("PRAGMA synchronous = NORMAL")
            await self._db.execute(
                f"CREATE TABLE IF NOT EXISTS {_RAW_NAME} (collection TEXT NOT NULL, key TEXT NOT NULL,"
                " value TEXT NOT NULL, expires_at REAL, PRIMARY KEY (collection, key)) WITHOUT ROWID"
            )
        return self._db

    async def get(self, key: str, *, collection: str | None = None) -> dict[str, Any] | None:
        """The value of ``key``, or None."""
        db = self._db or await self._connection()
        rows = await db.execute_fetchall(
            f"SELECT value FROM {_RAW_NAME} WHERE collection = ? AND key = ? AND {self._LIVE}",
            (collection, key, time.time()),
        )
        return json.loads(rows[0][0]) if rows else None

    async def ttl(self, key: str, *, collection: str | None = None) -> tuple[dict[str, Any] | None, float | None]:
        """The value and remaining seconds of ``key``."""
        db = self._db or await self._connection()
        now = time.time()
        rows = await db.execute_fetchall(
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
        db = self._db or await self._connection()
        await db.execute(
            f"INSERT OR REPLACE INTO {_RAW_NAME} VALUES (?, ?, ?, ?)",
            (collection, key, json.dumps(value), _expires(ttl, time.time())),
        )

    async def get_many(self, keys: Sequence[str], *, collection: str | None = None) -> list[dict[str, Any] | None]:
        """The values of ``keys`` (one SELECT ... IN)."""
        db = self._db or await self._connection()
        rows = await db.execute_fetchall(
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
        """Store each value under its key in one transaction."""
        db = self._db or await self._connection()
        expires = _expires(ttl, time.time())
        rows = [(collection, key, json.dumps(value), expires) for key, value in zip(keys, values)]
        async with self._lock:
            await db.execute("BEGIN IMMEDIATE")
            await db.executemany(f"INSERT OR REPLACE INTO {_RAW_NAME} VALUES (?, ?, ?, ?)", rows)
            await db.execute("COMMIT")

    async def delete_many(self, keys: Sequence[str], *, collection: str | None = None) -> int:
        """Delete ``keys`` (one DELETE ... IN); return how many existed."""
        db = self._db or await self._connection()
        cursor = await db.execute(
            f"DELETE FROM {_RAW_NAME} WHERE collection = ? AND key IN ({','.join('?' * len(keys))}) AND {self._LIVE}",
            (collection, *keys, time.time()),
        )
        return int(cursor.rowcount)

    async def aclose(self) -> None:
        """Close the connection and delete the baseline's file."""
        if self._db is not None:
            await self._db.close()
        if self._path != ":memory:":
            await asyncio.to_thread(self._remove_files)

    def _remove_files(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(self._path + suffix).unlink(missing_ok=True)


class RedisAsyncStore:
    """Raw redis.asyncio: GET/SET PX/MGET/DEL, GET+PTTL and MULTI/EXEC in one pipeline each."""

    def __init__(self, url: str) -> None:
        from redis.asyncio import Redis

        self._client: Any = Redis.from_url(url)

    @staticmethod
    def _name(collection: str | None, key: str) -> str:
        return f"{_RAW_NAME}:{collection}:{key}"

    async def get(self, key: str, *, collection: str | None = None) -> dict[str, Any] | None:
        """The value of ``key``, or None."""
        raw = await self._client.get(self._name(collection, key))
        return None if raw is None else json.loads(raw)

    async def ttl(self, key: str, *, collection: str | None = None) -> tuple[dict[str, Any] | None, float | None]:
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
        px = None if ttl is None else int(ttl * 1000)
        await self._client.set(self._name(collection, key), json.dumps(value), px=px)

    async def get_many(self, keys: Sequence[str], *, collection: str | None = None) -> list[dict[str, Any] | None]:
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
        """Store each value under its key (one MULTI/EXEC)."""
        px = None if ttl is None else int(ttl * 1000)
        pipe = self._client.pipeline(transaction=True)
        for key, value in zip(keys, values):
            pipe.set(self._name(collection, key), json.dumps(value), px=px)
        await pipe.execute()

    async def delete_many(self, keys: Sequence[str], *, collection: str | None = None) -> int:
        """Delete ``keys`` (one DEL); return how many existed."""
        return int(await self._client.delete(*(self._name(collection, key) for key in keys)))

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

    async def get(self, key: str, *, collection: str | None = None) -> dict[str, Any] | None:
        """The value of ``key``, or None."""
        document = await self._entries.find_one({"_id": f"{collection}:{key}"})
        return None if document is None or self._expired(document) else document["v"]

    @staticmethod
    def _expired(document: dict[str, Any]) -> bool:
        return "e" in document and document["e"] <= time.time()

    async def ttl(self, key: str, *, collection: str | None = None) -> tuple[dict[str, Any] | None, float | None]:
        """The value and remaining seconds of ``key``."""
        document = await self._entries.find_one({"_id": f"{collection}:{key}"})
        if document is None or self._expired(document):
            return None, None
        return document["v"], document["e"] - time.time() if "e" in document else None

    @staticmethod
    def _document(value: Mapping[str, Any], ttl: float | None) -> dict[str, Any]:
        return {"v": value} if ttl is None else {"v": value, "e": time.time() + ttl}

    async def put(
        self, key: str, value: Mapping[str, Any], *, collection: str | None = None, ttl: float | None = None
    ) -> None:
        """Store ``value`` (one upserting replace)."""
        await self._entries.replace_one({"_id": f"{collection}:{key}"}, self._document(value, ttl), upsert=True)

    async def get_many(self, keys: Sequence[str], *, collection: str | None = None) -> list[dict[str, Any] | None]:
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

    async def aclose(self) -> None:
        """Drop the baseline's collection and close the client."""
        await self._entries.drop()
        await self._client.close()


def _py_key_value(kind: str, url: str) -> Any:
    """py-key-value-aio's store for ``kind`` on ``url``, or None when it has none (or is not installed)."""
    try:
        if kind == "memory":
            from key_value.aio.stores.memory import MemoryStore

            return MemoryStore()
        if kind == "redis":
            from key_value.aio.stores.redis import RedisStore

            return RedisStore(url=url)
        if kind == "mongodb":
            from key_value.aio.stores.mongodb import MongoDBStore

            return MongoDBStore(url=url, db_name="kvbench")
    except ImportError:
        return None
    return None


def baselines(url: str, sqlite_path: str | None) -> dict[str, Any]:
    """The baselines for a store URL: name -> store-like object with the benchmarked methods.

    ``sqlite_path`` is the file the SQLite store under test uses (None for other backends);
    the raw aiosqlite baseline writes a file beside it.
    """
    kind = family(url)
    found: dict[str, Any] = {}
    if kind == "memory":
        found["dict+json"] = DictJsonStore()
    elif kind == "sqlite" and sqlite_path is not None:
        in_memory = sqlite_path == ":memory:"
        found["aiosqlite"] = AiosqliteStore(sqlite_path if in_memory else f"{sqlite_path}.{_RAW_NAME}")
    elif kind == "redis" and not url.startswith("redis+cluster"):
        found["redis.asyncio"] = RedisAsyncStore(url)
    elif kind == "mongodb":
        found["pymongo"] = PymongoStore(url)
    theirs = _py_key_value(kind, url)
    if theirs is not None:
        found["py-key-value"] = theirs
    return found
