"""SQLite signals: a table in the store's file, appended by publish and polled by one task.

Layout (created on first use beside the store's own tables)::

    kvstores_signals(id INTEGER PRIMARY KEY AUTOINCREMENT, channel TEXT, message TEXT, created_at REAL)

SQLite runs one writer at a time, so ids are committed in order and without holes; the poller
reads ``id > last`` every 10 ms after traffic, backing off to every 40 ms when idle (WAL: a read
never blocks a writer). Publishers delete rows older than RETENTION seconds; a poller that finds
its next id already deleted (it fell that far behind) reports a GAP. The channel uses a
connection of its own (its polls never queue behind the store's calls). ``sqlite://:memory:``
is private to one store object: its signals stay in process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

import aiosqlite

from kvstores.backends.sqlite import _translated_error
from kvstores.base import translated
from kvstores.signals._memory import MemoryTransport
from kvstores.signals._transport import Backoff, Sink, Transport

logger = logging.getLogger(__name__)

RETENTION: Final = 60.0
"""Seconds a published row is kept."""

_POLL: Final = (0.01, 0.04)  # poll interval after traffic, and when idle
_BATCH: Final = 1_000
_CREATE = (
    "CREATE TABLE IF NOT EXISTS kvstores_signals (id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " channel TEXT NOT NULL, message TEXT NOT NULL, created_at REAL NOT NULL)"
)
_INSERT = "INSERT INTO kvstores_signals (channel, message, created_at) VALUES (?, ?, ?)"
_PRUNE = "DELETE FROM kvstores_signals WHERE created_at < ?"
_LAST = "SELECT seq FROM sqlite_sequence WHERE name = 'kvstores_signals'"
_SINCE = "SELECT id, channel, message FROM kvstores_signals WHERE id > ? ORDER BY id LIMIT ?"


def transport(store: Any, sink: Sink) -> Transport:
    """The transport of a SQLiteStore: the file's table, or in process for ``:memory:``."""
    if store.path == ":memory:":
        return MemoryTransport(store, sink)
    return SQLiteTransport(store, sink)


class SQLiteTransport(Transport):
    """One connection and one polling task for every subscriber of one channel object."""

    def __init__(self, store: Any, sink: Sink) -> None:
        super().__init__(store, sink)
        self._path: str = store.path
        self._timeout: float = store._timeout
        self._names: set[str] = set()
        self._db: aiosqlite.Connection | None = None
        self._opening = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._last = 0
        self._next_prune = 0.0

    async def _connection(self) -> aiosqlite.Connection:
        async with self._opening:
            if self._db is None:
                with translated(_translated_error):
                    db = await aiosqlite.connect(self._path, timeout=self._timeout, isolation_level=None)
                    try:
                        await db.execute("PRAGMA journal_mode=WAL")
                        await db.execute(_CREATE)
                    except BaseException:
                        await db.close()
                        raise
                self._db = db
            return self._db

    async def listen(self, name: str) -> None:
        self._names.add(name)
        if self._task is None:
            db = await self._connection()
            with translated(_translated_error):
                rows = list(await db.execute_fetchall(_LAST))
            self._last = int(rows[0][0]) if rows else 0
            self._task = self.sink.spawn(self._poll(db))

    async def unlisten(self, name: str) -> None:
        self._names.discard(name)

    async def publish(self, name: str, message: str) -> None:
        db = await self._connection()
        now = time.time()
        with translated(_translated_error):
            await (await db.execute(_INSERT, (name, message, now))).close()
            if now >= self._next_prune:
                self._next_prune = now + RETENTION / 4
                await (await db.execute(_PRUNE, (now - RETENTION,))).close()

    async def _poll(self, db: aiosqlite.Connection) -> None:
        backoff = Backoff()
        interval = _POLL[0]
        while self.store_open:
            try:
                rows = list(await db.execute_fetchall(_SINCE, (self._last, _BATCH)))
            except Exception as exc:
                logger.warning("SQLite signals: %s: %s; polling again", type(exc).__name__, exc)
                await backoff.wait()
                continue
            backoff.reset()
            if rows:
                if rows[0][0] != self._last + 1:
                    self.sink.gap()  # pruned before this poller read them
                for row_id, name, message in rows:
                    self._last = row_id
                    if name in self._names:
                        self.sink.deliver(name, message)
                interval = _POLL[0]
            else:
                interval = min(interval * 1.5, _POLL[1])
            await asyncio.sleep(interval)

    async def aclose(self) -> None:
        async with self._opening:
            db, self._db = self._db, None
            if db is not None:
                await db.close()
