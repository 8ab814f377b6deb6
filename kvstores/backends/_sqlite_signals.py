"""SQLite signals: a table in the store's file, appended by publish and polled by one task.

Layout (created on first use beside the store's own tables)::

    kvstores_signals(id INTEGER PRIMARY KEY AUTOINCREMENT, channel TEXT, message TEXT, created_at REAL)

SQLite runs one writer at a time, so ids are committed in order and without holes; the poller
(:class:`kvstores.signals._transport.NumberedPoll`, as for MongoDB and MariaDB) reads ``id >
last`` every 10 ms after traffic, backing off to every 40 ms when idle (WAL: a read never blocks
a writer). A poll reads the table only when a commit may have landed since its last read: the
file's write-ahead log changed, or changed less than :data:`QUIET` seconds ago (a file system's
clock may be that coarse); an idle file costs a ``stat()`` per poll, not a query on a thread.
Publishers delete rows older than RETENTION seconds; a poller that finds its next id
already deleted (it fell that far behind) reports a GAP. The channel uses a
connection of its own (its polls never queue behind the store's calls). ``sqlite://:memory:``
is private to one store object: its signals stay in process.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Final

import aiosqlite

from kvstores._signal_host import SignalHost, Sink, Transport
from kvstores.backends._memory_signals import MemoryTransport
from kvstores.signals._transport import NumberedPoll

RETENTION: Final = 60.0
"""Seconds a published row is kept."""

QUIET: Final = 3.0
"""Seconds the write-ahead log must have gone unmodified, by its mtime, before a poll may skip the read."""

_BATCH: Final = 1_000
_CREATE = (
    "CREATE TABLE IF NOT EXISTS kvstores_signals (id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " channel TEXT NOT NULL, message TEXT NOT NULL, created_at REAL NOT NULL)"
)
_INSERT = "INSERT INTO kvstores_signals (channel, message, created_at) VALUES (?, ?, ?)"
_PRUNE = "DELETE FROM kvstores_signals WHERE created_at < ?"
_LAST = "SELECT seq FROM sqlite_sequence WHERE name = 'kvstores_signals'"
_SINCE = "SELECT id, channel, message FROM kvstores_signals WHERE id > ? ORDER BY id LIMIT ?"


def transport(store: SignalHost, sink: Sink, path: str, timeout: float) -> Transport[SignalHost]:
    """The transport of a SQLiteStore on ``path``: the file's table, or in process for ``:memory:``."""
    if path == ":memory:":
        return MemoryTransport(store, sink)
    return SQLiteTransport(store, sink, path, timeout)


class SQLiteTransport(NumberedPoll[SignalHost]):
    """One connection and one polling task for every subscriber of one channel object."""

    intervals = (0.01, 0.04)

    def __init__(self, store: SignalHost, sink: Sink, path: str, timeout: float) -> None:
        """Signals in the SQLite file at ``path``, waiting up to ``timeout`` seconds for its lock."""
        super().__init__(store, sink)
        self._path = path
        self._timeout = timeout
        self._db: aiosqlite.Connection | None = None
        self._opening = asyncio.Lock()
        self._next_prune = 0.0
        self._read_at: tuple[int, int, int] | None = None  # the log as it was just before the last read

    async def _connection(self) -> aiosqlite.Connection:
        async with self._opening:
            if self._db is None:
                with self.translated():
                    db = await aiosqlite.connect(self._path, timeout=self._timeout, isolation_level=None)
                    try:
                        await db.execute("PRAGMA journal_mode=WAL")
                        await db.execute(_CREATE)
                    except BaseException:
                        await db.close()
                        raise
                self._db = db
            return self._db

    async def _latest(self) -> int:
        db = await self._connection()
        with self.translated():
            rows = list(await db.execute_fetchall(_LAST))
        return int(rows[0][0]) if rows else 0

    async def _since(self, number: int) -> list[tuple[int, str, str]]:
        log = _log_state(self._path)
        if log is not None and log == self._read_at and time.time() - log[2] / 1e9 > QUIET:
            return []  # no commit since the last read: nothing can have been published
        db = await self._connection()
        rows = [
            (int(row_id), str(name), str(message))
            for row_id, name, message in await db.execute_fetchall(_SINCE, (number, _BATCH))
        ]
        self._read_at = log  # taken before the read: a commit during it changes the log again
        return rows

    async def publish(self, name: str, message: str) -> None:
        db = await self._connection()
        now = time.time()
        with self.translated():
            await (await db.execute(_INSERT, (name, message, now))).close()
            if now >= self._next_prune:
                self._next_prune = now + RETENTION / 4
                await (await db.execute(_PRUNE, (now - RETENTION,))).close()

    async def aclose(self) -> None:
        self._read_at = None
        async with self._opening:
            db, self._db = self._db, None
            if db is not None:
                await db.close()


def _log_state(path: str) -> tuple[int, int, int] | None:
    """(inode, size, mtime in ns) of the write-ahead log of the database at ``path``; None without one.

    Every commit in WAL mode writes to the log (a checkpoint that resets it writes its header
    again), so an unchanged state means no commit since it was taken.
    """
    try:
        found = os.stat(path + "-wal")
    except OSError:
        return None
    return found.st_ino, found.st_size, found.st_mtime_ns
