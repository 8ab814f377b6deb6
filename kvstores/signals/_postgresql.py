"""PostgreSQL signals: LISTEN/NOTIFY on one dedicated connection per channel object.

A channel ``name`` of a store on table T is the PostgreSQL channel ``kvs_`` + a digest of
(T, name), a valid identifier of 63 characters whatever the name. Publishing is
``SELECT pg_notify(...)`` on the store's own pool (its timeout and error translation). The
listening connection is opened from the store's URL and options (or taken from the pool the
user passed in, for as long as the channel lives); asyncpg's termination listener and a
``SELECT 1`` every HEARTBEAT seconds notice when it is lost: it is then reopened with backoff
and every channel listened to again, followed by a GAP.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

import asyncpg

from kvstores.backends.postgresql import _translated_error
from kvstores.base import translated
from kvstores.errors import StoreClosedError
from kvstores.signals._transport import HEARTBEAT, Backoff, Sink, Transport, digest

logger = logging.getLogger(__name__)

_POOL_ONLY: Final = frozenset(
    {"min_size", "max_size", "max_queries", "max_inactive_connection_lifetime", "setup", "init", "reset"}
)
_NOTIFY: Final = "SELECT pg_notify($1, $2)"


def _setter(event: asyncio.Event) -> Any:
    """A termination listener that sets ``event``."""
    return lambda connection: event.set()


class PostgreSQLTransport(Transport):
    """One LISTEN connection (and a task watching it) for every subscriber of one channel object."""

    def __init__(self, store: Any, sink: Sink) -> None:
        super().__init__(store, sink)
        self._url: str | None = store._url
        self._pool: asyncpg.Pool[Any] | None = None if store._owns_pool else store.pool
        self._options = {name: value for name, value in store._pool_options.items() if name not in _POOL_ONLY}
        self._timeout: float = store._timeout
        self._table: str = store.table
        self._names: dict[str, str] = {}  # PostgreSQL channel -> name
        self._connection: Any = None
        self._up = asyncio.Event()
        self._lock = asyncio.Lock()  # one statement at a time on the connection
        self._task: asyncio.Task[None] | None = None
        self._owe_gap = False

    def _channel(self, name: str) -> str:
        return "kvs_" + digest(self._table, name)[:59]

    async def listen(self, name: str) -> None:
        channel = self._channel(name)
        self._names[channel] = name
        if self._task is None or self._task.done():
            self._task = self.sink.spawn(self._run())
        if not self._up.is_set():
            try:
                async with asyncio.timeout(self._timeout):
                    await self._up.wait()
            except TimeoutError:
                pass
        async with self._lock:
            if self._connection is None:
                self._owe_gap = True  # the reader listens once connected, then reports the GAP
                return
            try:
                await self._connection.add_listener(channel, self._notified)
            except Exception as exc:  # the reader notices the broken connection and redoes it
                logger.debug("PostgreSQL signals: LISTEN %s failed: %s", channel, exc)
                self._owe_gap = True

    async def unlisten(self, name: str) -> None:
        channel = self._channel(name)
        self._names.pop(channel, None)
        async with self._lock:
            if self._connection is not None:
                try:
                    await self._connection.remove_listener(channel, self._notified)
                except Exception as exc:
                    logger.debug("PostgreSQL signals: UNLISTEN %s failed: %s", channel, exc)

    async def publish(self, name: str, message: str) -> None:
        store = self._store()
        if store is None:
            raise StoreClosedError("the signal channel's store is gone")
        with translated(_translated_error):  # _query is a helper of the primitives, not one itself
            await store._query("fetchval", _NOTIFY, self._channel(name), message)

    def _notified(self, connection: Any, pid: int, channel: str, payload: str) -> None:
        name = self._names.get(channel)
        if name is not None:
            self.sink.deliver(name, payload)

    # -- the connection ------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = Backoff()
        while self.store_open:
            connection = None
            lost = asyncio.Event()
            try:
                async with self._lock:
                    connection = await asyncio.wait_for(self._connect(), self._timeout)
                    connection.add_termination_listener(_setter(lost))
                    for channel in list(self._names):
                        await connection.add_listener(channel, self._notified)
                    self._connection = connection
                self._up.set()
                backoff.reset()
                if self._owe_gap:
                    self._owe_gap = False
                    self.sink.gap()
                await self._watch(connection, lost)
            except Exception as exc:
                logger.warning("PostgreSQL signals: %s: %s; reconnecting", type(exc).__name__, exc)
            finally:
                self._up.clear()
                self._connection = None
                self._owe_gap = True
                if connection is not None:
                    await self._disconnect(connection)
            await backoff.wait()

    async def _watch(self, connection: Any, lost: asyncio.Event) -> None:
        """Return only when the connection is lost (or the store closed)."""
        while self.store_open:
            try:
                async with asyncio.timeout(HEARTBEAT):
                    await lost.wait()
            except TimeoutError:
                pass
            if lost.is_set() or connection.is_closed():
                raise ConnectionError("the LISTEN connection was closed")
            async with self._lock:
                await connection.fetchval("SELECT 1", timeout=3 * HEARTBEAT)

    async def _connect(self) -> Any:
        if self._pool is not None:
            return await self._pool.acquire()
        return await asyncpg.connect(self._url, **self._options)

    async def _disconnect(self, connection: Any) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                if self._pool is not None:
                    await self._pool.release(connection)
                else:
                    await connection.close()
        except Exception:  # a dead or hung server: drop the socket
            connection.terminate()
