"""The SQL-server backends' connection side: :class:`PooledStore`, what a dialect supplies and how a call runs.

A store on PostgreSQL or MariaDB/MySQL (:mod:`kvstores.backends._sql`) makes its driver's pool
on first use and checks its table's schema version then (creating the table when missing);
each call runs on a pool connection within the store's timeout, a statement the server picked as
a deadlock victim runs again (up to 3 times), a connection a failure may have broken is
dropped, and a connection cut mid-statement by a cancel or the deadline is given up the
dialect's way. Driver errors become kvstores errors in :meth:`PooledStore._translate` only.
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, ClassVar, Final, TypeVar

from kvstores.base import BaseStore
from kvstores.errors import KVStoreError, StoreConnectionError
from kvstores.loop import deadline

__all__ = ["SCHEMA_VERSION", "VERSION_ROW", "PooledStore", "digest"]

T = TypeVar("T")

SCHEMA_VERSION = 1
"""The schema version this code reads and writes."""

_DEADLOCK_ATTEMPTS: Final = 3  # a statement (or transaction) the server chose as a deadlock victim runs again


def digest(name: bytes) -> bytes:
    """The 32-byte SHA-256 digest that keys ``name`` in the index."""
    return hashlib.sha256(name).digest()


VERSION_ROW: Final = (digest(b""), digest(b"schema_version"), b"", b"schema_version")
"""The row that holds the table's schema version (no kvstores collection is empty)."""


class PooledStore(BaseStore):
    """A store on a SQL server's connection pool: the dialect's hooks, and the life of its pool and calls."""

    pool: Any = None
    _owns_pool = True  # class defaults: __del__ reads them even when __init__ failed
    _ready_pool: Any = None

    label: ClassVar[str]
    """The server's name in messages (``PostgreSQL``, ``MySQL``)."""

    table: str
    """The quoted name of the store's table."""

    _driver_errors: ClassVar[tuple[type[Exception], ...]]  # any of them, not unreachable: KVStoreError
    _timeout: float
    _opening: asyncio.Lock
    _background: set[asyncio.Task[None]]

    # -- what a dialect supplies (besides its statements and the bulk primitives) ---------

    @abc.abstractmethod  # keep what the pool is made from (options: the caller's other keyword options)
    def _configure(self, url: str | None, max_connections: int, statement_cache_size: int, options: Any) -> None: ...

    @abc.abstractmethod  # a new pool that connects on demand
    async def _create_pool(self) -> Any: ...

    async def _close_pool(self, pool: Any) -> None:
        """Close the store's own ``pool``, waiting for its connections."""
        await pool.close()

    @abc.abstractmethod  # the version the table holds in ``row``; None without the table or the row
    async def _read_version(self, connection: Any, row: Sequence[bytes]) -> str | None: ...

    @abc.abstractmethod  # create the table when missing and add ``version`` (row and value), once across processes
    async def _create_table(self, connection: Any, version: Sequence[Any]) -> None: ...

    @abc.abstractmethod  # give ``connection`` back to ``pool``
    async def _release(self, pool: Any, connection: Any) -> None: ...

    @abc.abstractmethod
    def _abandon(self, pool: Any, connection: Any) -> Callable[[], None] | None:
        """Give up ``connection`` in the middle of a statement (the call was cancelled);
        returns what to do when the store's own deadline cut it, if anything."""

    @abc.abstractmethod  # close ``connection`` left broken, so that the pool connects anew
    def _drop(self, connection: Any) -> None: ...

    @staticmethod
    @abc.abstractmethod  # the server rolled the statement (or transaction) back as a deadlock victim
    def _is_deadlock(exc: Exception) -> bool: ...

    @staticmethod
    @abc.abstractmethod  # the connection may be unusable after ``exc`` (a clean SQL error leaves it fine)
    def _is_broken(exc: BaseException) -> bool: ...

    @staticmethod
    @abc.abstractmethod  # the server cannot be had (now): StoreConnectionError
    def _is_unreachable(exc: Exception) -> bool: ...

    # -- connection ------------------------------------------------------------------

    async def _ready(self) -> Any:
        """The pool, created on first use, with the table created and its version checked (run by _run)."""
        async with self._opening:
            self._check_open()  # nothing reopens after aclose()
            if self._ready_pool is None:
                if self.pool is None:
                    self.pool = await self._create_pool()
                    await self._release_with_loop()
                async with self.pool.acquire() as connection:
                    await self._check_schema(connection)
                self._ready_pool = self.pool
        return self._ready_pool

    async def _check_schema(self, connection: Any) -> None:
        version = await self._read_version(connection, VERSION_ROW)
        if version is None:  # a new table (or one made by hand without the row)
            await self._create_table(connection, (*VERSION_ROW, str(SCHEMA_VERSION)))
            version = await self._read_version(connection, VERSION_ROW)
        if version != str(SCHEMA_VERSION):
            raise KVStoreError(
                f"{self.label} table {self.table} holds kvstores schema version {version}; "
                f"this kvstores reads version {SCHEMA_VERSION}"
            )

    def _holds_connection(self) -> bool:
        return self._owns_pool and self.pool is not None

    def _translate(self, exc: Exception) -> KVStoreError | None:
        if self._is_unreachable(exc):
            return StoreConnectionError(f"{self.label}: {type(exc).__name__}: {exc}")
        if isinstance(exc, self._driver_errors):
            return KVStoreError(f"{self.label}: {type(exc).__name__}: {exc}")
        return None

    async def _close(self) -> None:
        async with self._opening:
            pool, self._ready_pool = self.pool, None
            if self._owns_pool and pool is not None:
                self.pool = None
                try:
                    async with deadline(self._timeout):
                        await self._close_pool(pool)
                except Exception:  # an unreachable or hung server: drop the connections
                    pool.terminate()
                for task in list(self._background):  # clean-ups of cut statements on the pool: moot now
                    task.cancel()

    async def _run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``work(connection)`` on a pool connection within the store's timeout (errors untranslated)."""
        cut: Callable[[], None] | None = None  # what to do when our deadline interrupted a statement
        try:
            async with deadline(self._timeout):  # first use included: waiting for another opener too
                pool = self._ready_pool or await self._ready()
                try:
                    connection = await pool.acquire()
                except RuntimeError:  # asyncmy's pool is closing: aclose() ran meanwhile
                    self._check_open()
                    raise
                try:
                    for _ in range(_DEADLOCK_ATTEMPTS - 1):
                        try:
                            return await work(connection)
                        except Exception as exc:
                            # the server rolled back this statement (or transaction): running it again is exact
                            if not self._is_deadlock(exc):
                                raise
                    return await work(connection)
                except asyncio.CancelledError:
                    # our deadline or the caller's cancel: the connection is mid-protocol
                    cut = self._abandon(pool, connection)
                    connection = None
                    raise
                except BaseException as exc:
                    if self._is_broken(exc):
                        self._drop(connection)
                    raise
                finally:
                    if connection is not None:
                        await self._release(pool, connection)
        except TimeoutError:
            if cut is not None:
                cut()
            raise

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` off the caller's time, keeping a strong reference until it is done."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        """Let go of a finished background ``task``; its error is nobody's (a clean-up that failed)."""
        self._background.discard(task)
        if not task.cancelled():
            task.exception()
