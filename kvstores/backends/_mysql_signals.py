"""MariaDB/MySQL signals: a table beside the store's, appended by publish and polled by one task.

Layout, for a store in table T::

    T_signals(id BIGINT AUTO_INCREMENT PRIMARY KEY, channel VARBINARY(1024),
              message MEDIUMTEXT utf8mb4, created_at DATETIME(6) (UTC))

MySQL has no LISTEN/NOTIFY, so this is SQLite's design on a server: the poller reads ``id >
last`` through the store's own pool every 20 ms after traffic, backing off to every 50 ms when
idle. InnoDB hands out ids at insert and transactions commit in any order, so a hole can be a
publisher still committing: the poller (:class:`kvstores.signals._transport.NumberedPoll`)
waits for it up to a second, keeping order, then reports a GAP and moves on. Publishers delete
rows older than RETENTION seconds. The table is created on first use (``CREATE TABLE IF NOT
EXISTS``): a least-privileged user needs it made once by an owner, as the store's own table.
``auto_increment_increment`` above 1 (Galera) leaves a hole after every id: signals still
arrive, each hole costing that second and a GAP.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

from asyncmy import errors as my_errors

from kvstores._signal_host import Sink, SQLHost
from kvstores.signals._transport import NumberedPoll

logger = logging.getLogger(__name__)

RETENTION: Final = 60.0
"""Seconds a published row is kept."""

_BATCH: Final = 1_000
_NO_SUCH_TABLE: Final = 1146  # ER_NO_SUCH_TABLE


def signal_table(table: str) -> str:
    """The quoted name of the signals table beside the store's quoted ``table``."""
    return f"{table[:-1]}_signals`"


class MySQLTransport(NumberedPoll[SQLHost]):
    """One polling task for every subscriber of one channel object, on the store's pool."""

    def __init__(self, store: SQLHost, sink: Sink) -> None:
        """Polls through ``store``'s :meth:`~kvstores._signal_host.SQLHost.fetch`, on its pool."""
        super().__init__(store, sink)
        table = signal_table(store.table)
        self._create = (
            f"CREATE TABLE IF NOT EXISTS {table} (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,"
            " channel VARBINARY(1024) NOT NULL, message MEDIUMTEXT CHARACTER SET utf8mb4 NOT NULL,"
            " created_at DATETIME(6) NOT NULL, KEY (created_at))"
        )
        self._insert = f"INSERT INTO {table} (channel, message, created_at) VALUES (%s, %s, UTC_TIMESTAMP(6))"
        self._prune = f"DELETE FROM {table} WHERE created_at < UTC_TIMESTAMP(6) - INTERVAL %s SECOND"
        self._last_id = f"SELECT COALESCE(MAX(id), 0) FROM {table}"
        self._since_sql = f"SELECT id, channel, message FROM {table} WHERE id > %s ORDER BY id LIMIT {_BATCH}"
        self._next_prune = 0.0

    async def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        store = self.live_store()
        with self.translated():  # fetch is the store's door for transports, not a primitive
            try:
                rows = await store.fetch(sql, *args)
            except my_errors.ProgrammingError as exc:
                if exc.args[0] != _NO_SUCH_TABLE:
                    raise
                # made on first use (IF NOT EXISTS only when missing: on an existing table
                # it makes the server warn, and the driver logs every warning)
                await store.fetch(self._create)
                rows = await store.fetch(sql, *args)
        return list(rows)

    async def _latest(self) -> int:
        return int((await self._query(self._last_id))[0][0])

    async def _since(self, number: int) -> list[tuple[int, str, str]]:
        return [
            (int(row_id), bytes(name).decode(), str(message))
            for row_id, name, message in await self._query(self._since_sql, (number,))
        ]

    async def publish(self, name: str, message: str) -> None:
        await self._query(self._insert, (name.encode(), message))
        now = time.time()
        if now >= self._next_prune:
            self._next_prune = now + RETENTION / 4
            await self._query(self._prune, (RETENTION,))
