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
is not granted within ``timeout`` seconds (default 5) raises StoreConnectionError (a lone put,
one statement, is a transaction of its own). Each
call is one hop to aiosqlite's connection thread: the whole transaction runs there, so
calls never interleave and a bulk call is one transaction, chunked under SQLite's
parameter limit. put_if_absent, pop and update's compare-and-set each read and write in
one ``BEGIN IMMEDIATE`` transaction, which no other process can interleave; update's
function runs on the event loop between its read and that transaction, with no lock held.

URLs: ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``, ``sqlite://:memory:``
(private to one store object), with query options such as ``?timeout=2``.
Options: ``timeout``, ``sweep_interval``, ``default_collection``.
Requires SQLite >= 3.24 (upsert) — any Python 3.10+ build has it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote, urlsplit

from kvstores._optional import missing_extra
from kvstores._urls import redact
from kvstores.base import DEFAULT_COLLECTION, BaseStore, Entry, Stored, chunks
from kvstores.errors import KVStoreError, StoreConnectionError

if TYPE_CHECKING:
    from kvstores._signal_host import Sink, Transport

try:
    import aiosqlite
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("aiosqlite", "sqlite") from exc

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

SCHEMA_VERSION = 1
"""The schema version this code reads and writes."""

T = TypeVar("T")
Work = Callable[[sqlite3.Connection], T]

_QUERY_OPTIONS = {"timeout": float, "sweep_interval": float, "default_collection": str}
_CHUNK = 500  # keys per IN (...) list: far below any SQLite parameter limit
_LIVE = "(expires_at IS NULL OR expires_at > ?)"
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS kvstores_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    f"INSERT OR IGNORE INTO kvstores_meta VALUES ('schema_version', '{SCHEMA_VERSION}')",
    "CREATE TABLE IF NOT EXISTS kvstores_entries (collection TEXT NOT NULL, key TEXT NOT NULL,"
    " value TEXT NOT NULL, expires_at REAL, PRIMARY KEY (collection, key)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS kvstores_entries_expiry ON kvstores_entries (expires_at) WHERE expires_at IS NOT NULL",
)
_KEYS = f"SELECT key FROM kvstores_entries WHERE collection = ? AND {_LIVE} ORDER BY key LIMIT ?"
_KEYS_AFTER = f"SELECT key FROM kvstores_entries WHERE collection = ? AND key > ? AND {_LIVE} ORDER BY key LIMIT ?"
_UPSERT = "INSERT OR REPLACE INTO kvstores_entries (collection, key, value, expires_at) VALUES (?, ?, ?, ?)"
_SELECT_ONE = f"SELECT value FROM kvstores_entries WHERE collection = ? AND key = ? AND {_LIVE}"
_SWEEP = "DELETE FROM kvstores_entries WHERE expires_at <= ?"
_DELETE_ONE = "DELETE FROM kvstores_entries WHERE collection = ? AND key = ?"


def _in_list(count: int) -> str:
    return f"IN ({','.join('?' * count)})"


async def _on_thread(db: aiosqlite.Connection, work: Work[T]) -> T:
    """Run ``work`` on ``db``'s thread in one hop, through aiosqlite's private queue.

    Its public calls take a hop per statement, and a write transaction then needs a lock around
    its hops: 3 to 8 times fewer writes per second from 64 tasks. The pyproject cap and
    tests/test_private_names.py fence ``_execute`` and ``_conn``.

    ``work`` must not return a cursor: one finalized on the event loop's thread while the
    connection's thread runs the next statement is an SQLite API misuse.
    """
    result: T = await db._execute(work, db._conn)  # type: ignore[no-untyped-call]
    return result


def _translated_error(exc: Exception) -> KVStoreError | None:
    """Translate sqlite3/aiosqlite errors: the one place this backend does it."""
    if isinstance(exc, sqlite3.OperationalError):
        return StoreConnectionError(f"SQLite: {exc}")
    if isinstance(exc, (sqlite3.Error, ValueError)):
        # aiosqlite raises ValueError when its connection died underneath it
        return KVStoreError(f"SQLite: {exc}")
    return None


# -- work run on the connection's thread ---------------------------------------------


def _create_schema(conn: sqlite3.Connection) -> int:
    for statement in _SCHEMA:
        conn.execute(statement)
    return int(conn.execute("SELECT value FROM kvstores_meta WHERE name = 'schema_version'").fetchone()[0])


def _enable_wal(timeout: float, conn: sqlite3.Connection) -> None:
    """Put the file in WAL mode (a property of the file: usually done by its first opener).

    Switching needs the file to itself and does not wait on ``busy_timeout``: while another
    connection writes, it fails at once (or reports the old mode), so it is retried until
    ``timeout``. Reading the mode first spares every later opener the switch.
    """
    deadline = time.monotonic() + timeout
    while str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
        try:
            if str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower() == "wal":
                return
        except sqlite3.OperationalError:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise sqlite3.OperationalError("could not switch the database to WAL mode: it stayed busy")
        time.sleep(0.01)


def _setup(timeout: float, wal: bool, conn: sqlite3.Connection) -> int:
    conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
    if wal:
        _enable_wal(timeout, conn)
        conn.execute("PRAGMA synchronous = NORMAL")
    return _transaction(_create_schema, None, conn)


def _transaction(work: Work[T], sweep_before: float | None, conn: sqlite3.Connection) -> T:
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = work(conn)
        if sweep_before is not None:
            conn.execute(_SWEEP, (sweep_before,))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


def _select_live(collection: str, keys: Sequence[str], conn: sqlite3.Connection) -> dict[str, tuple[str, float | None]]:
    now = time.time()
    found: dict[str, tuple[str, float | None]] = {}
    for chunk in chunks(keys, _CHUNK):
        rows = conn.execute(
            f"SELECT key, value, expires_at FROM kvstores_entries"
            f" WHERE collection = ? AND key {_in_list(len(chunk))} AND {_LIVE}",
            (collection, *chunk, now),
        )
        for key, value, expires_at in rows:
            found[key] = (value, None if expires_at is None else expires_at - now)
    return found


def _select_pairs(pairs: Sequence[tuple[str, str]], conn: sqlite3.Connection) -> list[str | None]:
    """The live text of each (collection, key) pair, every collection in one hop to the thread."""
    keys_by_collection: dict[str, list[str]] = {}
    for collection, key in pairs:
        keys_by_collection.setdefault(collection, []).append(key)
    found = {
        (collection, key): row[0]
        for collection, keys in keys_by_collection.items()
        for key, row in _select_live(collection, keys, conn).items()
    }
    return [found.get(pair) for pair in pairs]


def _delete_live(collection: str, keys: Sequence[str], conn: sqlite3.Connection) -> int:
    now = time.time()
    return sum(
        conn.execute(
            f"DELETE FROM kvstores_entries WHERE collection = ? AND key {_in_list(len(chunk))} AND {_LIVE}",
            (collection, *chunk, now),
        ).rowcount
        for chunk in chunks(keys, _CHUNK)
    )


def _delete_where(where: str, parameters: tuple[str, ...], conn: sqlite3.Connection) -> bool:
    live = conn.execute(f"DELETE FROM kvstores_entries WHERE {where} AND {_LIVE}", (*parameters, time.time()))
    conn.execute(f"DELETE FROM kvstores_entries WHERE {where}", parameters)
    return live.rowcount > 0


def _live_text(collection: str, key: str, conn: sqlite3.Connection) -> str | None:
    row = conn.execute(_SELECT_ONE, (collection, key, time.time())).fetchone()
    return None if row is None else str(row[0])


def _swap_row(
    collection: str, key: str, expected: Stored | None, text: str | None, ttl: float | None, conn: sqlite3.Connection
) -> bool:
    """Compare and set inside the caller's BEGIN IMMEDIATE transaction: no other writer can interleave."""
    if _live_text(collection, key, conn) != expected:
        return False
    if text is None:
        conn.execute(_DELETE_ONE, (collection, key))
    else:
        conn.execute(_UPSERT, (collection, key, text, None if ttl is None else time.time() + ttl))
    return True


def _pop_row(collection: str, key: str, conn: sqlite3.Connection) -> str | None:
    text = _live_text(collection, key, conn)
    if text is not None:
        conn.execute(_DELETE_ONE, (collection, key))
    return text


class SQLiteStore(BaseStore):
    """A persistent store in one SQLite database file, safe for several processes."""

    db_system = "sqlite"
    connections = 1  # one connection, on aiosqlite's thread: coalesced calls wait for the flight to land
    url_options = _QUERY_OPTIONS

    def __init__(
        self,
        path: str | Path,
        *,
        timeout: float = 5.0,
        sweep_interval: float = 60.0,
        default_collection: str = DEFAULT_COLLECTION,
        batching: bool | None = None,
        encryption_keys: Sequence[str] | None = None,
    ) -> None:
        super().__init__(default_collection=default_collection, batching=batching, encryption_keys=encryption_keys)
        self.path = str(path)
        self._timeout = timeout
        self._sweep_interval = sweep_interval
        self._next_sweep = 0.0
        self._db: aiosqlite.Connection | None = None
        self._opening = asyncio.Lock()

    @classmethod
    def _from_parsed_url(cls, url: str, **options: Any) -> SQLiteStore:
        """Open ``sqlite:///rel.db``, ``sqlite:////abs.db`` or ``sqlite://:memory:``."""
        parts = urlsplit(url)
        if parts.netloc == ":memory:" or parts.path in ("/:memory:", ""):
            path = ":memory:"
        elif parts.netloc:
            raise ValueError(f"{redact(url)!r}: use sqlite:///relative.db or sqlite:////absolute/path.db")
        else:
            path = unquote(parts.path[1:])
        if parts.query:
            raise ValueError(
                f"{redact(url)!r}: unknown options; SQLite URLs take {', '.join(_QUERY_OPTIONS)}, batching"
            )
        return cls(path, **options)

    # -- running work on the connection's thread -----------------------------------

    async def _open(self) -> aiosqlite.Connection:
        db = await aiosqlite.connect(self.path, timeout=self._timeout, isolation_level=None)
        try:
            version = await _on_thread(db, partial(_setup, self._timeout, self.path != ":memory:"))
            if version != SCHEMA_VERSION:
                raise KVStoreError(f"{self.path}: schema version {version}; this kvstores reads {SCHEMA_VERSION}")
        except BaseException:
            await db.close()
            raise
        return db

    async def _run(self, work: Work[T]) -> T:
        """Run ``work`` on the connection's thread in one hop (aiosqlite runs one at a time)."""
        db = self._db
        if db is None:
            async with self._opening:
                self._check_open()
                if self._db is None:
                    self._db = await self._open()
                    await self._release_with_loop()
                db = self._db
        return await _on_thread(db, work)

    async def _write(self, work: Work[T], *, one_statement: bool = False) -> T:
        """Run ``work`` in a BEGIN IMMEDIATE transaction, sweeping expired rows when due; ``one_statement``
        work with no sweep due runs alone (in autocommit one statement is a transaction of its own)."""
        now = time.time()
        if now < self._next_sweep:
            return await self._run(work if one_statement else partial(_transaction, work, None))
        self._next_sweep = now + self._sweep_interval
        return await self._run(partial(_transaction, work, now))

    def _holds_connection(self) -> bool:
        return self._db is not None

    def _signal_transport(self, sink: Sink) -> Transport[Any]:
        from kvstores.backends._sqlite_signals import transport  # only a store that signals loads it

        return transport(self, sink, self.path, self._timeout)

    def _translate(self, exc: Exception) -> KVStoreError | None:
        return _translated_error(exc)

    async def _close(self) -> None:
        async with self._opening:
            if self._db is not None:
                db, self._db = self._db, None
                await db.close()

    # -- primitives ------------------------------------------------------------------

    async def _get(self, collection: str, key: str) -> str | None:
        return await self._run(partial(_live_text, collection, key))

    async def _get_many(self, collection: str, keys: Sequence[str]) -> list[str | None]:
        found = await self._run(partial(_select_live, collection, keys))
        return [found[key][0] if key in found else None for key in keys]

    async def _ttl_many(self, collection: str, keys: Sequence[str]) -> list[tuple[str | None, float | None]]:
        found = await self._run(partial(_select_live, collection, keys))
        return [found.get(key, (None, None)) for key in keys]

    async def _get_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[str | None]:
        return await self._run(partial(_select_pairs, pairs))

    async def _put_entries(self, entries: Sequence[Entry]) -> None:
        now = time.time()
        rows = [(collection, key, text, None if ttl is None else now + ttl) for collection, key, text, ttl in entries]
        await self._write(lambda conn: conn.executemany(_UPSERT, rows).close())

    async def _put(self, collection: str, key: str, text: str, ttl: float | None) -> None:
        row = (collection, key, text, None if ttl is None else time.time() + ttl)
        await self._write(lambda conn: conn.execute(_UPSERT, row).close(), one_statement=True)

    async def _put_many(self, collection: str, keys: Sequence[str], texts: list[str], ttl: float | None) -> None:
        expires_at = None if ttl is None else time.time() + ttl
        rows = [(collection, key, text, expires_at) for key, text in zip(keys, texts)]
        await self._write(lambda conn: conn.executemany(_UPSERT, rows).close())

    async def _delete_many(self, collection: str, keys: Sequence[str]) -> int:
        return await self._write(partial(_delete_live, collection, keys))

    async def _keys(self, collection: str, limit: int | None, after: str | None) -> list[str]:
        # TEXT's BINARY collation compares UTF-8 bytes: code-point order, as Python compares str
        sql = _KEYS if after is None else _KEYS_AFTER
        live = (time.time(), -1 if limit is None else limit)
        parameters = (collection, *live) if after is None else (collection, after, *live)
        rows = await self._run(lambda conn: conn.execute(sql, parameters).fetchall())
        return [key for (key,) in rows]

    async def _collections(self, limit: int | None) -> list[str]:
        sql = f"SELECT DISTINCT collection FROM kvstores_entries WHERE {_LIVE} ORDER BY collection LIMIT ?"
        parameters = (time.time(), -1 if limit is None else limit)
        rows = await self._run(lambda conn: conn.execute(sql, parameters).fetchall())
        return [name for (name,) in rows]

    async def _destroy_collection(self, collection: str) -> bool:
        return await self._write(partial(_delete_where, "collection = ?", (collection,)))

    async def _destroy(self) -> bool:
        return await self._write(partial(_delete_where, "1", ()))

    async def _cull(self) -> None:
        self._next_sweep = 0.0
        await self._write(lambda conn: None)

    async def _ping(self) -> None:
        await self._run(lambda conn: conn.execute("SELECT 1").fetchone())

    async def _swap(
        self, collection: str, key: str, expected: Stored | None, text: str | None, ttl: float | None
    ) -> bool:
        return await self._write(partial(_swap_row, collection, key, expected, text, ttl))

    async def _pop(self, collection: str, key: str) -> str | None:
        return await self._write(partial(_pop_row, collection, key))
