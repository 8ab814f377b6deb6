"""What the SQL-server backends (PostgreSQL, MariaDB/MySQL) do alike: :class:`SQLServerStore`.

Both keep every entry in one table (``kvstores_entries`` by default, or the ``table`` option),
schema version 1: a row is ``(collection_id, key_id, collection, key, value, expires_at)``.
Names can be 1,024 characters, up to 4 KiB of UTF-8 each, past any index's key length: so the
primary key is the pair of SHA-256 digests of the UTF-8 names, and the names themselves are
stored beside them, in full, and compared too, so a digest collision can never mix two entries
up. The value is the JSON text kvstores encoded. The row with the empty collection (no kvstores
collection is empty) holds the schema version; a table of another version raises KVStoreError
rather than being misread.

Expiry uses the server's clock (``expires_at = <now> + ttl``; every read filters ``expires_at >
<now>``), so every client agrees whatever its own clock says. Expired rows are invisible at
once; writes delete up to 1,000 of them at most every ``sweep_interval`` seconds (default 60;
again at the next write while a sweep finds a full batch), and ``cull()`` deletes all of them,
through the expiry index. Each call is one statement in autocommit (one round trip); update's
compare-and-set is ``UPDATE`` (or ``DELETE``) ``... WHERE value = <the text read> AND <live>``,
its outcome the statement's row count. Bulk writes lock their rows in primary-key order, so
overlapping ones queue rather than deadlock; a statement the server still picks as a deadlock
victim runs again, up to 3 times. No lock is ever held while the caller's code runs.

The table is created on first use when missing, under a lock across processes, so several
processes starting at once create it once. Least privilege: when the table exists, the store
issues no DDL at all, so a role with SELECT, INSERT, UPDATE and DELETE on that table suffices:
create it once as a privileged role (open a store with it, or run the DDL and insert the
version row), then grant those to the application's role. ``destroy()`` deletes the store's
rows, never the table or anything else.

Options, the same on both (also in the URL's query): ``table`` (``name`` or ``<schema>.name``,
letters, digits and ``_``; always quoted); ``timeout`` (default 5 s: bounds each call as a
whole: waiting for a free pool connection, connecting and the statement; past it, or when the
server refuses, shuts down, kills or times out the statement, StoreConnectionError);
``max_connections`` (default 10: the pool's size); ``statement_cache_size``;
``sweep_interval``; ``default_collection``; ``batching`` (concurrent single-key gets and puts
ride together in one statement; on unless ``KVSTORES_BATCHING=off``). Errors: an unreachable
server and the store's own deadline raise StoreConnectionError with the driver's error as
``__cause__``; a connection left broken is dropped and the pool connects anew, so the same
store object works again once the server is back; any other driver error raises KVStoreError.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import re
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Final, TypeVar

from kvstores.backends._sql_pool import SCHEMA_VERSION, PooledStore, digest
from kvstores.base import DEFAULT_COLLECTION, Entry, Stored

__all__ = [
    "DEFAULT_TABLE",
    "SCHEMA_VERSION",
    "SQLServerStore",
    "Statements",
    "collection_ids",
    "decoded",
    "digest",
    "row_ids",
]

T = TypeVar("T")

DEFAULT_TABLE = "kvstores_entries"
"""The table used when none is given."""

SWEEP_BATCH: Final = 1_000
"""Expired rows one sweep deletes at most."""

_STORE_QUERY_OPTIONS = {
    "table": str,
    "timeout": float,
    "max_connections": int,
    "statement_cache_size": int,
    "sweep_interval": float,
    "default_collection": str,
}
_NO_LIMIT: Final = 2**63 - 1  # LIMIT of a listing without one (both servers take a 64-bit LIMIT)
_CACHED: Final = 1_000  # collections whose (digest, name) are kept ready


def decoded(raw: bytes) -> str | None:
    """A stored name as text, or None when it is not UTF-8 (so not written by kvstores)."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return None


@functools.lru_cache(maxsize=_CACHED)
def collection_ids(collection: str) -> tuple[bytes, bytes]:
    """``(digest, UTF-8 name)`` of ``collection``: the parameters that pick a collection's rows."""
    name = collection.encode()
    return digest(name), name


def row_ids(collection: str, key: str) -> tuple[bytes, bytes, bytes, bytes]:
    """``(collection_id, key_id, collection, key)``: the parameters that pick one row."""
    collection_id, name = collection_ids(collection)
    encoded = key.encode()
    return collection_id, digest(encoded), name, encoded


class Statements:
    """The statements of one table that read alike in every dialect; a dialect's subclass names
    its own SQL in the class attributes below and adds the statements only it has.

    Parameters: a row is (collection_id, key_id, collection, key); a TTL is what
    :meth:`SQLServerStore._expiry` makes of one.
    """

    key: ClassVar[str]  # the quoted key column
    now: ClassVar[str]  # the server's clock
    placeholder: ClassVar[str]  # of parameter n (from 1), a format string: "${}", or "%s" when positional
    remaining: ClassVar[str]  # the seconds left until a row expires
    expiry_of: ClassVar[str]  # the expiry of a TTL, a format string of its parameter's placeholder
    sweep_batch: ClassVar[int] = SWEEP_BATCH
    sweep: str  # deletes up to sweep_batch expired rows
    put: str  # a row, its text and TTL: insert or replace
    insert_if_absent: str  # the same, or take over an expired row; a live row stays (0 rows changed)

    def mark(self, number: int) -> str:
        """The placeholder of parameter ``number``."""
        return self.placeholder.format(number)

    def expiry(self, mark: str) -> str:
        """The expiry of the TTL in the parameter of placeholder ``mark``."""
        return self.expiry_of.format(mark)

    def __init__(self, table: str) -> None:
        """The statements of the quoted ``table``."""
        self.table = table
        mark, key, now, remaining, expiry = self.mark, self.key, self.now, self.remaining, self.expiry
        self.live = live = f"(expires_at IS NULL OR expires_at > {now})"
        self.columns = f"(collection_id, key_id, collection, {key}, value, expires_at)"
        row = self.row(1)
        self.version = f"SELECT value FROM {table} WHERE {row}"
        self.get = f"SELECT value FROM {table} WHERE {row} AND {live}"
        self.ttl = f"SELECT value, {remaining} FROM {table} WHERE {row} AND {live}"
        # keys are bytes (UTF-8): their order is code-point order, as Python compares str
        in_collection = f"SELECT {key} FROM {table} WHERE collection_id = {mark(1)} AND collection = {mark(2)}"
        self.keys = f"{in_collection} AND {live} ORDER BY {key} LIMIT {mark(3)}"
        self.keys_after = f"{in_collection} AND {key} > {mark(3)} AND {live} ORDER BY {key} LIMIT {mark(4)}"
        self.collections = (
            f"SELECT DISTINCT collection FROM {table} WHERE collection <> '' AND {live}"
            f" ORDER BY collection LIMIT {mark(1)}"
        )
        self.cull = f"DELETE FROM {table} WHERE expires_at <= {now}"
        self.is_absent = f"SELECT NOT EXISTS (SELECT 1 FROM {table} WHERE {row} AND {live})"
        # the live rows first (their count is the answer), then the expired ones
        ours, expired = f"DELETE FROM {table} WHERE collection", f"AND expires_at <= {now}"
        by_collection = f"{ours}_id = {mark(1)} AND collection = {mark(2)}"
        self.destroy_collection = (f"{by_collection} AND {live}", f"{by_collection} {expired}")
        self.destroy = (f"{ours} <> '' AND {live}", f"{ours} <> '' {expired}")
        self.delete = f"DELETE FROM {table} WHERE {row} AND {live}"  # an expired row is left to the sweep
        self.pop = f"{self.delete} RETURNING value"
        self.delete_if = f"DELETE FROM {table} WHERE {row} AND value = {mark(5)} AND {live}"
        self.replace_if = (
            f"UPDATE {table} SET value = {mark(1)}, expires_at = {expiry(mark(2))}"
            f" WHERE {self.row(3)} AND value = {mark(7)} AND {live}"
        )

    def row(self, first: int) -> str:
        """The condition that picks one row, its four parameters numbered from ``first``."""
        mark = self.mark
        return (
            f"collection_id = {mark(first)} AND key_id = {mark(first + 1)}"
            f" AND collection = {mark(first + 2)} AND {self.key} = {mark(first + 3)}"
        )


class SQLServerStore(PooledStore):
    """A persistent store in one SQL-server table, shared by every process that opens it.

    ``table`` is the quoted name of that table; ``pool`` the driver's pool in use, once it is. A
    dialect supplies its statements (a :class:`Statements` subclass), driver calls and error classification.
    """

    url_options = _STORE_QUERY_OPTIONS
    statements: ClassVar[type[Statements]]
    """The dialect's statements."""

    statement_cache_default: ClassVar[int]
    """The ``statement_cache_size`` used when none is given."""

    _quote: ClassVar[str]  # the dialect's identifier quote
    _scope: ClassVar[str]  # what qualifies a table name ("schema", "database")
    _max_part: ClassVar[int]  # characters in a quoted identifier
    _max_name: ClassVar[int]  # characters in the table's own name (room left for names derived from it)

    def __init__(
        self,
        url: str | None = None,
        *,
        table: str = DEFAULT_TABLE,
        timeout: float = 5.0,
        max_connections: int = 10,
        statement_cache_size: int | None = None,
        sweep_interval: float = 60.0,
        default_collection: str = DEFAULT_COLLECTION,
        batching: bool | None = None,
        encryption_keys: Sequence[str] | None = None,
        **driver_options: Any,
    ) -> None:
        """Open nothing yet: the pool is made, and the table checked, on first use."""
        super().__init__(default_collection=default_collection, batching=batching, encryption_keys=encryption_keys)
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self.connections = max_connections
        self.table = self._quoted_table(table)
        self._sql = self.statements(self.table)
        self._url = url
        self._timeout = timeout
        self._opening = asyncio.Lock()
        self._sweep_interval = sweep_interval
        self._next_sweep = 0.0
        self._background: set[asyncio.Task[None]] = set()
        if statement_cache_size is None:
            statement_cache_size = self.statement_cache_default
        self._configure(url, max_connections, statement_cache_size, driver_options)

    @classmethod
    def _quoted_table(cls, table: str) -> str:
        """The quoted, validated table name."""
        if not isinstance(table, str):
            raise TypeError(f"table must be a str, not {type(table).__name__}")
        parts = table.split(".")
        identifier = re.compile(rf"[A-Za-z_][A-Za-z0-9_]{{0,{cls._max_part - 1}}}")
        if len(parts) > 2 or not all(identifier.fullmatch(part) for part in parts) or len(parts[-1]) > cls._max_name:
            raise ValueError(
                f"table must be 'name' or '{cls._scope}.name' of letters, digits and '_' (at most {cls._max_part}"
                f" characters each, {cls._max_name} for the name), got {table!r}"
            )
        return ".".join(f"{cls._quote}{part}{cls._quote}" for part in parts)

    def tables(self) -> list[str]:
        """The quoted tables this store creates (``destroy()`` empties them, never drops them)."""
        return [self.table]

    @staticmethod
    def _expiry(ttl: float | None) -> Any:
        """The TTL parameter of a statement's expiry (None: never expires): by default the seconds."""
        return ttl

    @abc.abstractmethod
    async def fetch(self, sql: str, *args: Any) -> Sequence[Sequence[Any]]:
        """The rows of one statement, run in autocommit on a pool connection within the store's timeout.

        Driver errors are raised as they are (translate them with :meth:`_translate`): this is
        the door through which a signal transport uses the store's pool.
        """

    @abc.abstractmethod  # the number of rows one statement changed, run as fetch runs it
    async def _count(self, sql: str, *args: Any) -> int: ...

    @abc.abstractmethod  # insert or replace rows (row_ids, text, TTL parameter), sorted, all or nothing
    async def _upsert(self, rows: list[tuple[Any, ...]]) -> None: ...

    @abc.abstractmethod  # the live rows (key, then ``columns``) of a collection (ids) among keys by key_id
    async def _select_rows(
        self, columns: str, collection: tuple[bytes, bytes], key_ids: list[bytes]
    ) -> Sequence[Sequence[Any]]: ...

    @abc.abstractmethod  # delete the live rows of a collection (ids) among (key_id, key) pairs, sorted; how many
    async def _delete_rows(self, collection: tuple[bytes, bytes], pairs: list[tuple[bytes, bytes]]) -> int: ...

    async def _value(self, sql: str, *args: Any) -> Any:
        """The first column of the first row of ``sql``; None without a row."""
        rows = await self.fetch(sql, *args)
        return rows[0][0] if rows else None

    async def _sweep_when_due(self) -> None:
        """Delete a batch of expired rows, at most every ``sweep_interval`` seconds (run with writes)."""
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + self._sweep_interval
            if await self._count(self._sql.sweep) == SWEEP_BATCH:  # more to do: sweep again at the next write
                self._next_sweep = now

    # -- primitives ------------------------------------------------------------------

    async def _get(self, collection: str, key: str) -> str | None:
        text: str | None = await self._value(self._sql.get, *row_ids(collection, key))
        return text

    async def _ttl(self, collection: str, key: str) -> tuple[str | None, float | None]:
        rows = await self.fetch(self._sql.ttl, *row_ids(collection, key))
        return (rows[0][0], rows[0][1]) if rows else (None, None)

    async def _select_many(
        self, collection: str, keys: Sequence[str], columns: str
    ) -> tuple[list[bytes], dict[bytes, Sequence[Any]]]:
        """The keys as UTF-8, and the live rows (key, then ``columns``) among them by key."""
        encoded = [key.encode() for key in keys]
        rows = await self._select_rows(columns, collection_ids(collection), [digest(key) for key in encoded])
        return encoded, {row[0]: row for row in rows}

    async def _get_many(self, collection: str, keys: Sequence[str]) -> list[str | None]:
        encoded, found = await self._select_many(collection, keys, "value")
        return [None if (row := found.get(key)) is None else row[1] for key in encoded]

    async def _ttl_many(self, collection: str, keys: Sequence[str]) -> list[tuple[str | None, float | None]]:
        encoded, found = await self._select_many(collection, keys, f"value, {self._sql.remaining}")
        return [(None, None) if (row := found.get(key)) is None else (row[1], row[2]) for key in encoded]

    async def _put(self, collection: str, key: str, text: str, ttl: float | None) -> None:
        await self._sweep_when_due()
        await self._count(self._sql.put, *row_ids(collection, key), text, self._expiry(ttl))

    async def _put_entries(self, entries: Sequence[Entry]) -> None:
        await self._sweep_when_due()
        # bulk writes lock rows in primary-key order (as _delete_many does): overlapping ones queue, never deadlock
        await self._upsert(sorted((*row_ids(c, key), text, self._expiry(ttl)) for c, key, text, ttl in entries))

    async def _delete_many(self, collection: str, keys: Sequence[str]) -> int:
        return await self._delete_rows(
            collection_ids(collection), sorted((digest(k.encode()), k.encode()) for k in keys)
        )

    async def _put_many(self, collection: str, keys: Sequence[str], texts: list[str], ttl: float | None) -> None:
        await self._put_entries([(collection, key, text, ttl) for key, text in zip(keys, texts)])

    async def _delete(self, collection: str, key: str) -> bool:
        return await self._count(self._sql.delete, *row_ids(collection, key)) > 0

    async def _pop(self, collection: str, key: str) -> str | None:
        text: str | None = await self._value(self._sql.pop, *row_ids(collection, key))
        return text

    async def _live_then_expired(self, statements: tuple[str, str], *args: Any) -> bool:
        live, expired = statements
        deleted = await self._count(live, *args)
        await self._count(expired, *args)
        return deleted > 0

    async def _destroy_collection(self, collection: str) -> bool:
        return await self._live_then_expired(self._sql.destroy_collection, *collection_ids(collection))

    async def _destroy(self) -> bool:
        return await self._live_then_expired(self._sql.destroy)

    async def _names_of(self, sql: str, *args: Any, limit: int | None) -> list[str]:
        rows = await self.fetch(sql, *args, _NO_LIMIT if limit is None else limit)
        return [name for (raw,) in rows if (name := decoded(raw)) is not None]

    async def _keys(self, collection: str, limit: int | None, after: str | None) -> list[str]:
        if after is None:
            return await self._names_of(self._sql.keys, *collection_ids(collection), limit=limit)
        return await self._names_of(self._sql.keys_after, *collection_ids(collection), after.encode(), limit=limit)

    async def _collections(self, limit: int | None) -> list[str]:
        return await self._names_of(self._sql.collections, limit=limit)

    async def _cull(self) -> None:
        await self._count(self._sql.cull)

    async def _swap(
        self, collection: str, key: str, expected: Stored | None, text: str | None, ttl: float | None
    ) -> bool:
        row = row_ids(collection, key)
        if isinstance(expected, bytes):
            expected = expected.decode()
        if expected is None and text is None:  # delete what is absent: done while it stays absent
            return bool(await self._value(self._sql.is_absent, *row))
        if expected is None:
            await self._sweep_when_due()
            return await self._count(self._sql.insert_if_absent, *row, text, self._expiry(ttl)) > 0
        if text is None:
            return await self._count(self._sql.delete_if, *row, expected) > 0
        return await self._count(self._sql.replace_if, text, self._expiry(ttl), *row, expected) > 0
