"""PostgreSQL signals: LISTEN/NOTIFY on one dedicated connection per channel object.

A channel ``name`` of a store on table T is the PostgreSQL channel ``kvs_`` + a digest of
(S, T, name), a valid identifier of 63 characters whatever the name; S is the schema an
unqualified T is found in (``current_schema()``, read once), since NOTIFY reaches every
listener of the database whatever schema it works in. Publishing is
``SELECT pg_notify(...)`` on the store's own pool (its timeout and error translation). The
listening connection is opened from the store's URL and options (or taken from the pool the
user passed in, for as long as the channel lives); asyncpg's termination listener and a
``SELECT 1`` every HEARTBEAT seconds notice when it is lost: it is then reopened with backoff
and every channel listened to again, followed by a GAP.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final, Protocol

import asyncpg

from kvstores._signal_host import Sink, SQLHost, Transport
from kvstores.loop import deadline, raise_if_cancelled
from kvstores.signals._transport import HEARTBEAT, Backoff, digest

logger = logging.getLogger(__name__)

_NOTIFY: Final = "SELECT pg_notify($1, $2)"
_SCHEMA: Final = "SELECT current_schema()"


def _setter(event: asyncio.Event) -> Any:
    """A termination listener that sets ``event``."""
    return lambda connection: event.set()


class PostgreSQLHost(SQLHost, Protocol):
    """What the PostgreSQL transport may ask of its store besides a statement on its pool."""

    async def listener(self) -> tuple[Any, asyncpg.Pool[Any] | None]:
        """A connection to LISTEN on, and the pool to release it to (None: close it when done)."""
        ...


class PostgreSQLTransport(Transport[PostgreSQLHost]):
    """One LISTEN connection (and a task watching it) for every subscriber of one channel object."""

    def __init__(self, store: PostgreSQLHost, sink: Sink, *, timeout: float) -> None:
        """Listens on connections from ``store``'s :meth:`PostgreSQLHost.listener`."""
        super().__init__(store, sink)
        self._timeout = timeout
        self._table = store.table
        # An unqualified table is found through the search path: its schema scopes the channels too
        # (NOTIFY reaches every listener of the database, whatever schema it works in).
        self._schema: str | None = "" if "." in store.table else None
        self._wanted: set[str] = set()  # the names listened to, kept while the schema is not known
        self._pool: asyncpg.Pool[Any] | None = None  # the user's pool the connection came from
        self._names: dict[str, str] = {}  # PostgreSQL channel -> name
        self._connection: Any = None
        self._up = asyncio.Event()
        self._lock = asyncio.Lock()  # one statement at a time on the connection
        self._task: asyncio.Task[None] | None = None
        self._owe_gap = False

    def _channel(self, name: str) -> str:
        assert self._schema is not None, "the schema is read before any channel is named"
        return "kvs_" + digest(self._schema, self._table, name)[:59]

    async def listen(self, name: str) -> None:
        self._wanted.add(name)
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
            channel = self._channel(name)  # connected: the schema is known
            self._names[channel] = name
            try:
                await self._connection.add_listener(channel, self._notified)
            except Exception as exc:  # the reader notices the broken connection and redoes it
                logger.debug("PostgreSQL signals: LISTEN %s failed: %s", channel, exc)
                self._owe_gap = True

    async def unlisten(self, name: str) -> None:
        self._wanted.discard(name)
        if self._schema is None:
            return  # never connected: nothing is listened to
        channel = self._channel(name)
        self._names.pop(channel, None)
        async with self._lock:
            if self._connection is not None:
                try:
                    await self._connection.remove_listener(channel, self._notified)
                except Exception as exc:
                    logger.debug("PostgreSQL signals: UNLISTEN %s failed: %s", channel, exc)

    async def publish(self, name: str, message: str) -> None:
        store = self.live_store()
        with self.translated():  # fetch is the store's door for transports, not a primitive
            if self._schema is None:
                (row,) = await store.fetch(_SCHEMA)
                self._schema = str(row[0])
            await store.fetch(_NOTIFY, self._channel(name), message)

    def _notified(self, connection: Any, pid: int, channel: str, payload: str) -> None:
        name = self._names.get(channel)
        if name is not None:
            self.sink.deliver(name, payload)

    # -- the connection ------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = Backoff()
        while self.store_open:
            raise_if_cancelled()  # one that the driver swallowed on 3.11: stop, never reconnect through it
            connection = None
            lost = asyncio.Event()
            try:
                async with self._lock:
                    async with deadline(self._timeout):
                        connection = await self._connect()
                    connection.add_termination_listener(_setter(lost))
                    if self._schema is None:
                        self._schema = str(await connection.fetchval(_SCHEMA))
                    self._names = {self._channel(name): name for name in self._wanted}
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
            raise_if_cancelled()
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
        connection, self._pool = await self.live_store().listener()
        return connection

    async def _disconnect(self, connection: Any) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                if self._pool is not None:
                    await self._pool.release(connection)
                else:
                    await connection.close()
        except Exception:  # a dead or hung server: drop the socket
            connection.terminate()
