"""SQLiteStore: a persistent store in one SQLite file, on aiosqlite.

Schema (version 1, recorded in ``kvstores_meta``)::

    kvstores_entries(collection TEXT, key TEXT, value TEXT, expires_at REAL,
                     PRIMARY KEY (collection, key)) WITHOUT ROWID

``expires_at`` is a wall-clock UNIX time so that every process sharing the file agrees.
Expired rows are invisible at once (every read filters them) and are deleted by a sweep
that runs with a write at most every ``sweep_interval`` seconds (default 60) and by
``cull()``.

The file is opened lazily in WAL mode with a ``busy_timeout``; every write runs in a
``BEGIN IMMEDIATE`` transaction, so several processes may share one file; a lock that
is not granted within ``timeout`` seconds (default 5) raises StoreConnectionError. Bulk
calls are one transaction, chunked under SQLite's parameter limit.

URLs: ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``, ``sqlite://:memory:``
(private to one store object), with query options such as ``?timeout=2``.
Options: ``timeout``, ``sweep_interval``, ``default_collection``.
Requires SQLite >= 3.24 (upsert) — any Python 3.10+ build has it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from kvstores._optional import missing_extra
from kvstores.base import DEFAULT_COLLECTION, BaseStore
from kvstores.errors import KVStoreError, StoreConnectionError

try:
    import aiosqlite
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("aiosqlite", "sqlite") from exc

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

SCHEMA_VERSION = 1
"""The schema version this code reads and writes."""

_CHUNK = 500  # keys per IN (...) list: far below any SQLite parameter limit
_LIVE = "(expires_at IS NULL OR expires_at > ?)"
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS kvstores_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    f"INSERT OR IGNORE INTO kvstores_meta VALUES ('schema_version', '{SCHEMA_VERSION}')",
    "CREATE TABLE IF NOT EXISTS kvstores_entries (collection TEXT NOT NULL, key TEXT NOT NULL,"
    " value TEXT NOT NULL, expires_at REAL, PRIMARY KEY (collection, key)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS kvstores_entries_expiry ON kvstores_entries (expires_at) WHERE expires_at IS NOT NULL",
)
_UPSERT = "INSERT OR REPLACE INTO kvstores_entries (collection, key, value, expires_at) VALUES (?, ?, ?, ?)"


def _chunks(keys: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(keys), _CHUNK):
        yield keys[start : start + _CHUNK]


def _marks(count: int) -> str:
    return ",".join("?" * count)


@contextmanager
def _translated() -> Iterator[None]:
    """Translate sqlite3/aiosqlite errors: the one place this backend does it."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        raise StoreConnectionError(f"SQLite: {exc}") from exc
    except (sqlite3.Error, ValueError) as exc:
        # aiosqlite raises ValueError when its connection died underneath it
        raise KVStoreError(f"SQLite: {exc}") from exc


class SQLiteStore(BaseStore):
    """A persistent store in one SQLite database file, safe for several processes."""

    def __init__(
        self,
        path: str | Path,
        *,
        timeout: float = 5.0,
        sweep_interval: float = 60.0,
        default_collection: str = DEFAULT_COLLECTION,
    ) -> None:
        super().__init__(default_collection=default_collection)
        self.path = str(path)
        self._timeout = timeout
        self._sweep_interval = sweep_interval
        self._next_sweep = 0.0
        self._db: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SQLiteStore:
        """Open ``sqlite:///rel.db``, ``sqlite:////abs.db`` or ``sqlite://:memory:``."""
        parts = urlsplit(url)
        if parts.netloc == ":memory:" or parts.path in ("/:memory:", ""):
            path = ":memory:"
        elif parts.netloc:
            raise ValueError(f"{url!r}: use sqlite:///relative.db or sqlite:////absolute/path.db")
        else:
            path = unquote(parts.path[1:])
        query: dict[str, Any] = {name: float(value) for name, value in parse_qsl(parts.query)}
        return cls(path, **{**query, **options})

    # -- connection ------------------------------------------------------------------

    async def _open(self) -> aiosqlite.Connection:
        db = await aiosqlite.connect(self.path, timeout=self._timeout, isolation_level=None)
        try:
            await db.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
            if self.path != ":memory:":
                await db.execute("PRAGMA journal_mode = WAL")
                await db.execute("PRAGMA synchronous = NORMAL")
            await db.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA:
                    await db.execute(statement)
                rows = await db.execute_fetchall("SELECT value FROM kvstores_meta WHERE name = 'schema_version'")
                await db.execute("COMMIT")
            except BaseException:
                await db.execute("ROLLBACK")
                raise
        except BaseException:
            await db.close()
            raise
        version = int(next(iter(rows))[0])
        if version != SCHEMA_VERSION:
            await db.close()
            raise KVStoreError(f"{self.path}: schema version {version}; this kvstores reads {SCHEMA_VERSION}")
        return db

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[aiosqlite.Connection]:
        async with self._lock:
            with _translated():
                if self._db is None:
                    self._db = await self._open()
                yield self._db

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        async with self._connection() as db:
            await db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                now = time.time()
                if now >= self._next_sweep:
                    await db.execute("DELETE FROM kvstores_entries WHERE expires_at <= ?", (now,))
                    self._next_sweep = now + self._sweep_interval
                await db.execute("COMMIT")
            except BaseException:
                await db.execute("ROLLBACK")
                raise

    async def _close(self) -> None:
        async with self._lock:
            if self._db is not None:
                db, self._db = self._db, None
                with _translated():
                    await db.close()

    # -- primitives ------------------------------------------------------------------

    async def _get(self, collection: str, key: str) -> str | None:
        async with self._connection() as db:
            rows = await db.execute_fetchall(
                f"SELECT value FROM kvstores_entries WHERE collection = ? AND key = ? AND {_LIVE}",
                (collection, key, time.time()),
            )
        for (value,) in rows:
            return str(value)
        return None

    async def _rows(self, collection: str, keys: Sequence[str]) -> dict[str, tuple[str, float | None]]:
        found: dict[str, tuple[str, float | None]] = {}
        async with self._connection() as db:
            now = time.time()
            for chunk in _chunks(keys):
                rows = await db.execute_fetchall(
                    f"SELECT key, value, expires_at FROM kvstores_entries"
                    f" WHERE collection = ? AND key IN ({_marks(len(chunk))}) AND {_LIVE}",
                    (collection, *chunk, now),
                )
                for key, value, expires_at in rows:
                    found[key] = (value, None if expires_at is None else expires_at - now)
        return found

    async def _get_many(self, collection: str, keys: Sequence[str]) -> list[str | None]:
        found = await self._rows(collection, keys)
        return [found[key][0] if key in found else None for key in keys]

    async def _ttl_many(self, collection: str, keys: Sequence[str]) -> list[tuple[str | None, float | None]]:
        found = await self._rows(collection, keys)
        return [found.get(key, (None, None)) for key in keys]

    async def _put_many(self, collection: str, keys: Sequence[str], texts: list[str], ttl: float | None) -> None:
        expires_at = None if ttl is None else time.time() + ttl
        async with self._transaction() as db:
            await db.executemany(_UPSERT, [(collection, key, text, expires_at) for key, text in zip(keys, texts)])

    async def _delete_many(self, collection: str, keys: Sequence[str]) -> int:
        deleted = 0
        async with self._transaction() as db:
            now = time.time()
            for chunk in _chunks(keys):
                cursor = await db.execute(
                    f"DELETE FROM kvstores_entries WHERE collection = ? AND key IN ({_marks(len(chunk))}) AND {_LIVE}",
                    (collection, *chunk, now),
                )
                deleted += cursor.rowcount
        return deleted

    async def _keys(self, collection: str, limit: int | None) -> list[str]:
        async with self._connection() as db:
            rows = await db.execute_fetchall(
                f"SELECT key FROM kvstores_entries WHERE collection = ? AND {_LIVE} ORDER BY key LIMIT ?",
                (collection, time.time(), -1 if limit is None else limit),
            )
        return [key for (key,) in rows]

    async def _collections(self, limit: int | None) -> list[str]:
        async with self._connection() as db:
            rows = await db.execute_fetchall(
                f"SELECT DISTINCT collection FROM kvstores_entries WHERE {_LIVE} ORDER BY collection LIMIT ?",
                (time.time(), -1 if limit is None else limit),
            )
        return [name for (name,) in rows]

    async def _destroy_where(self, where: str, parameters: tuple[str, ...]) -> bool:
        async with self._transaction() as db:
            cursor = await db.execute(
                f"DELETE FROM kvstores_entries WHERE {where} AND {_LIVE}", (*parameters, time.time())
            )
            live = cursor.rowcount > 0
            await db.execute(f"DELETE FROM kvstores_entries WHERE {where}", parameters)
        return live

    async def _destroy_collection(self, collection: str) -> bool:
        return await self._destroy_where("collection = ?", (collection,))

    async def _destroy(self) -> bool:
        return await self._destroy_where("1", ())

    async def _cull(self) -> None:
        self._next_sweep = 0.0
        async with self._transaction():
            pass
