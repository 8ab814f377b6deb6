"""PostgreSQLStore: a persistent store in one PostgreSQL table, on asyncpg's connection pool.

Layout (schema version 1; ``"kvstores_entries"`` by default, or the ``table`` option)::

    CREATE TABLE "kvstores_entries" (
        collection_id bytea NOT NULL,   -- sha256(UTF-8 collection name)
        key_id        bytea NOT NULL,   -- sha256(UTF-8 key)
        collection    bytea NOT NULL,   -- the UTF-8 collection name, in full
        key           bytea NOT NULL,   -- the UTF-8 key, in full
        value         text NOT NULL,    -- the entry's JSON text, exactly as kvstores encoded it
        expires_at    timestamptz,      -- NULL: never expires
        PRIMARY KEY (collection_id, key_id));
    CREATE INDEX "kvstores_entries_expiry" ON "kvstores_entries" (expires_at) WHERE expires_at IS NOT NULL;

Names can be 1,024 characters, up to 4 KiB of UTF-8 each: more than a B-tree index entry holds
(about 2.7 KB). So the primary key is a pair of fixed-size SHA-256 digests; the full names are
stored beside them and compared too (in the statement; bulk reads match the returned names),
so a pair's row is found by the index and matched exactly (injective without relying on the
digest). ``keys()`` and
``destroy_collection()`` use the index's ``collection_id`` prefix. Names are ``bytea`` because
PostgreSQL ``text`` cannot hold NUL, which keys may contain (read them with
``convert_from(key, 'UTF8')``). The value is ``text`` rather than ``jsonb``: ``jsonb`` would
reorder keys, reject ``\\u0000`` in strings and parse every value on the server, and kvstores
only ever needs its own text back. The row with the empty collection (no kvstores collection is empty) holds the
schema version; a table of another version raises KVStoreError rather than being misread.

Expiry uses the database clock: ``expires_at = now() + ttl`` and every read filters
``expires_at > now()``, so every client agrees whatever its own clock says. Expired rows are
invisible at once; writes delete up to 1,000 of them (``FOR UPDATE SKIP LOCKED``, so
concurrent sweepers never wait on each other) at most every ``sweep_interval`` seconds
(default 60; again at the next write while a sweep finds a full batch), and ``cull()`` deletes
all of them, through the partial index.

Statements (each call is ONE statement in autocommit, one round trip; asyncpg prepares each
once per connection): get/ttl = SELECT by the primary key; get_many/ttl_many = SELECT ...
``key_id = ANY($2)``; put = ``INSERT ... ON CONFLICT DO UPDATE``; put_many = the same over
``unnest($3, $4, $5)`` (one statement, so all or nothing, any number of keys);
delete = ``DELETE ... RETURNING``; delete_many = ``DELETE ... USING unnest(...)``;
put_if_absent = ``INSERT ... ON CONFLICT DO UPDATE ... WHERE <the row has expired>``;
pop = ``DELETE ... RETURNING value``; update's compare-and-set = ``UPDATE`` (or ``DELETE``)
``... WHERE value = <the text read> AND <live>``. Row locks and PostgreSQL's re-check of the
WHERE clause on the newest row version make each of them atomic against every other client.

The table and its index are created on first use when missing, in one transaction under a
transaction-level advisory lock, so several processes starting at once create them once.
Least privilege: when the table exists, the store issues no DDL at all, so it runs as a role
that merely owns the table (or has SELECT, INSERT, UPDATE, DELETE on it) and USAGE on its
schema: create the table once as a privileged role (open a store with it, or run the DDL
above and insert the version row), then ``ALTER TABLE ... OWNER TO`` the application's role.
``destroy()`` deletes the store's rows, never the table or anything else.

URLs: ``postgresql://user:password@host:5432/database`` (or ``postgres://``), passed to
asyncpg unchanged apart from the store's own query options (``table``, ``timeout``,
``max_connections``, ``statement_cache_size``, ``sweep_interval``, ``default_collection``,
``batching``), so libpq-style options work (``?sslmode=verify-full``, ``?sslrootcert=...``,
``?target_session_attrs=read-write``) and any other query option is a server setting
(``?search_path=app``).

Options: ``table`` (``name`` or ``schema.name``, letters, digits and ``_``, at most 55
characters for the name; always quoted); ``timeout`` (default 5 s: bounds each call as a
whole: waiting for a free pool connection, connecting and the statement; past it, or when
the server refuses, shuts down or cancels the statement, StoreConnectionError);
``max_connections`` (default 10: the pool's size); ``statement_cache_size`` (default 100;
set 0 behind PgBouncer in transaction mode: asyncpg then uses unnamed statements, which
costs a second round trip per call); ``sweep_interval``; ``default_collection``; ``batching``
(concurrent single-key gets and puts ride together in one statement; on unless
``KVSTORES_BATCHING=off``); other keyword options go to ``asyncpg.create_pool`` (e.g.
``ssl=``, ``server_settings=``). Or pass ``pool=`` an ``asyncpg.Pool`` you own: the store
never closes it, and its own settings (size, statement cache, reset) apply. The database
should use the UTF8 encoding.

The store's own pool connects on demand and skips asyncpg's per-release session reset (a
round trip per call: the store's statements leave no session state behind). Errors: a
refused or lost connection, a server shutting down or starting, a full server, a statement
cancelled or timed out (``statement_timeout``, ``lock_timeout``) and the store's own
deadline raise StoreConnectionError with asyncpg's error as ``__cause__``; a connection left
broken is dropped, and a timed-out statement is cancelled on the server, so the pool serves
the next call with a fresh connection and the same store object works again once the server
is back. Any other asyncpg error raises KVStoreError.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Sequence
from typing import Any, Final
from urllib.parse import urlsplit

from kvstores._optional import missing_extra
from kvstores.backends._rows import VERSION_ROW, RowNames, decoded, digest
from kvstores.base import DEFAULT_COLLECTION, BaseStore, Entry, Stored, deadline
from kvstores.errors import KVStoreError, StoreConnectionError

try:
    import asyncpg
    from asyncpg import exceptions as pg_errors
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("asyncpg", "postgresql") from exc


__all__ = ["DEFAULT_TABLE", "SCHEMA_VERSION", "PostgreSQLStore"]

SCHEMA_VERSION = 1
"""The schema version this code reads and writes."""

DEFAULT_TABLE = "kvstores_entries"
"""The table used when none is given."""

_STORE_QUERY_OPTIONS = {
    "table": str,
    "timeout": float,
    "max_connections": int,
    "statement_cache_size": int,
    "sweep_interval": float,
    "default_collection": str,
}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_MAX_TABLE_NAME: Final = 55  # leaves room for the index name "<table>_expiry" within 63 bytes
_SWEEP_BATCH: Final = 1_000
_DEADLOCK_ATTEMPTS: Final = 3  # a statement the server chose as a deadlock victim runs again
_UNREACHABLE = (
    OSError,  # refused, reset, unreachable, TLS failures; TimeoutError (our deadline) too
    pg_errors.PostgresConnectionError,  # class 08: the connection failed or was lost mid-call
    pg_errors.OperatorInterventionError,  # class 57: shutdown, starting up, statement timeout, cancel
    pg_errors.TooManyConnectionsError,
    pg_errors.LockNotAvailableError,  # lock_timeout
    pg_errors.InternalClientError,  # a connection the server dropped, caught mid-protocol
)

_CONNECTION_CLOSED = "the underlying connection is closed"  # asyncpg's InterfaceError for a lost connection

_BROKEN = (  # errors after which a connection may be unusable (a clean SQL error leaves it fine)
    OSError,
    pg_errors.PostgresConnectionError,
    pg_errors.AdminShutdownError,
    pg_errors.CrashShutdownError,
    pg_errors.IdleSessionTimeoutError,
    pg_errors.InternalClientError,
    pg_errors.InterfaceError,
)


def _translated_error(exc: Exception) -> KVStoreError | None:
    """Translate asyncpg errors: the one place this backend does it."""
    if isinstance(exc, _UNREACHABLE) or (isinstance(exc, pg_errors.InterfaceError) and _CONNECTION_CLOSED in str(exc)):
        # asyncpg reports a connection lost under a transaction as a plain InterfaceError
        return StoreConnectionError(f"PostgreSQL: {type(exc).__name__}: {exc}")
    if isinstance(exc, (pg_errors.PostgresError, pg_errors.InterfaceError, ValueError)):
        # ValueError: asyncpg's DSN parser and argument encoders
        return KVStoreError(f"PostgreSQL: {type(exc).__name__}: {exc}")
    return None


def _quoted_table(table: str) -> tuple[str, str]:
    """The quoted, validated table name and the quoted name of its expiry index."""
    if not isinstance(table, str):
        raise TypeError(f"table must be a str, not {type(table).__name__}")
    parts = table.split(".")
    name = parts[-1]
    if len(parts) > 2 or not all(_IDENTIFIER.fullmatch(part) for part in parts) or len(name) > _MAX_TABLE_NAME:
        raise ValueError(
            f"table must be 'name' or 'schema.name' of letters, digits and '_' (name at most {_MAX_TABLE_NAME}"
            f" characters), got {table!r}"
        )
    return ".".join(f'"{part}"' for part in parts), f'"{name}_expiry"'


async def _keep_session(connection: asyncpg.Connection[Any]) -> None:
    """Release a pool connection as it is: the store's statements leave no session state to reset.

    (asyncpg's default reset costs a round trip per call; an open transaction is still rolled back.)
    """


async def _release_quietly(pool: asyncpg.Pool[Any], connection: Any, within: float) -> None:
    """Return ``connection`` to ``pool`` in the background; asyncpg drops it if that fails."""
    with contextlib.suppress(Exception):
        await pool.release(connection, timeout=within)


class _Statements:
    """The SQL of one table, built once per store."""

    def __init__(self, table: str, index: str) -> None:
        live = "(expires_at IS NULL OR expires_at > now())"
        row = "collection_id = $1 AND key_id = $2 AND collection = $3 AND key = $4"
        expiry = "now() + $6::float8 * interval '1 second'"
        upsert = (
            "ON CONFLICT (collection_id, key_id) DO UPDATE SET value = EXCLUDED.value,"
            " expires_at = EXCLUDED.expires_at"
            f" WHERE {table}.collection = EXCLUDED.collection AND {table}.key = EXCLUDED.key"
        )
        columns = "(collection_id, key_id, collection, key, value, expires_at)"
        self.create = (
            f"CREATE TABLE {table} (collection_id bytea NOT NULL, key_id bytea NOT NULL, collection bytea NOT NULL,"
            " key bytea NOT NULL, value text NOT NULL, expires_at timestamptz, PRIMARY KEY (collection_id, key_id))",
            f"CREATE INDEX {index} ON {table} (expires_at) WHERE expires_at IS NOT NULL",
        )
        self.add_version = (
            f"INSERT INTO {table} {columns} VALUES ($1, $2, $3, $4, $5, NULL)"
            " ON CONFLICT (collection_id, key_id) DO NOTHING"
        )
        self.get = f"SELECT value FROM {table} WHERE {row} AND {live}"
        self.get_many = (
            f"SELECT key, value FROM {table}"
            f" WHERE collection_id = $1 AND key_id = ANY($2::bytea[]) AND collection = $3 AND {live}"
        )
        # a batch of gets and puts over any collections, one statement each (kvstores._batching)
        pairs = "unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::bytea[])"
        self.get_pairs = (
            f"SELECT u.i, t.value FROM {pairs} WITH ORDINALITY AS u(collection_id, key_id, collection, key, i)"
            f" JOIN {table} AS t ON t.collection_id = u.collection_id AND t.key_id = u.key_id"
            f" AND t.collection = u.collection AND t.key = u.key WHERE {live.replace('expires_at', 't.expires_at')}"
        )
        self.put_entries = (
            f"INSERT INTO {table} {columns} SELECT u.collection_id, u.key_id, u.collection, u.key, u.value,"
            " now() + u.ttl * interval '1 second'"
            " FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::bytea[], $5::text[], $6::float8[])"
            f" AS u(collection_id, key_id, collection, key, value, ttl) {upsert}"
        )
        remaining = "date_part('epoch', expires_at - now())"
        self.ttl = f"SELECT value, {remaining} FROM {table} WHERE {row} AND {live}"
        self.ttl_many = (
            f"SELECT key, value, {remaining} FROM {table}"
            f" WHERE collection_id = $1 AND key_id = ANY($2::bytea[]) AND collection = $3 AND {live}"
        )
        self.put = f"INSERT INTO {table} {columns} VALUES ($1, $2, $3, $4, $5, {expiry}) {upsert}"
        self.put_many = (
            f"INSERT INTO {table} {columns} SELECT $1, u.key_id, $2, u.key, u.value, {expiry}"
            f" FROM unnest($3::bytea[], $4::bytea[], $5::text[]) AS u(key_id, key, value) {upsert}"
        )
        self.delete = f"DELETE FROM {table} WHERE {row} RETURNING {live}"
        # rows are locked in key_id order first (as put_many writes them), so concurrent bulk
        # writes queue for each other instead of deadlocking
        self.delete_many = (
            f"WITH locked AS (SELECT t.key_id FROM {table} AS t"
            " JOIN unnest($2::bytea[], $4::bytea[]) AS u(key_id, key) ON t.key_id = u.key_id AND t.key = u.key"
            " WHERE t.collection_id = $1 AND t.collection = $3 ORDER BY t.key_id FOR UPDATE OF t),"
            f" gone AS (DELETE FROM {table} AS t USING locked WHERE t.collection_id = $1 AND t.key_id = locked.key_id"
            " RETURNING t.expires_at)"
            f" SELECT count(*) FROM gone WHERE {live}"
        )
        self.keys = (
            f"SELECT key FROM {table} WHERE collection_id = $1 AND collection = $2 AND {live} ORDER BY key LIMIT $3"
        )
        self.collections = (
            f"SELECT DISTINCT collection FROM {table} WHERE collection <> ''::bytea AND {live}"
            " ORDER BY collection LIMIT $1"
        )
        self.destroy_collection = (
            f"WITH gone AS (DELETE FROM {table} WHERE collection_id = $1 AND collection = $2 RETURNING expires_at)"
            f" SELECT EXISTS (SELECT FROM gone WHERE {live})"
        )
        self.destroy = (
            f"WITH gone AS (DELETE FROM {table} WHERE collection <> ''::bytea RETURNING expires_at)"
            f" SELECT EXISTS (SELECT FROM gone WHERE {live})"
        )
        self.cull = f"DELETE FROM {table} WHERE expires_at <= now()"
        self.sweep = (
            f"DELETE FROM {table} WHERE (collection_id, key_id) IN (SELECT collection_id, key_id FROM {table}"
            f" WHERE expires_at <= now() LIMIT {_SWEEP_BATCH} FOR UPDATE SKIP LOCKED)"
        )
        # put_if_absent: insert, or take over an expired row; a live row wins (no row returned)
        self.insert_if_absent = (
            f"INSERT INTO {table} {columns} VALUES ($1, $2, $3, $4, $5, {expiry}) {upsert}"
            f" AND {table}.expires_at <= now() RETURNING true"
        )
        self.is_absent = f"SELECT NOT EXISTS (SELECT FROM {table} WHERE {row} AND {live})"
        self.replace_if = (
            f"UPDATE {table} SET value = $5, expires_at = {expiry} WHERE {row} AND value = $7 AND {live} RETURNING true"
        )
        self.delete_if = f"DELETE FROM {table} WHERE {row} AND value = $5 AND {live} RETURNING true"
        self.pop = f"DELETE FROM {table} WHERE {row} RETURNING value, {live}"


class PostgreSQLStore(BaseStore):
    """A persistent store in one PostgreSQL table, shared by every process that opens it.

    ``table`` is the quoted name of that table; ``pool`` the asyncpg pool in use, once it is.
    """

    db_system = "postgresql"
    url_options = _STORE_QUERY_OPTIONS
    pool: asyncpg.Pool[Any] | None = None
    _owns_pool = False  # class defaults: __del__ reads them even when __init__ failed

    def __init__(
        self,
        url: str | None = None,
        *,
        pool: asyncpg.Pool[Any] | None = None,
        table: str = DEFAULT_TABLE,
        timeout: float = 5.0,
        max_connections: int = 10,
        statement_cache_size: int = 100,
        sweep_interval: float = 60.0,
        default_collection: str = DEFAULT_COLLECTION,
        batching: bool | None = None,
        **pool_options: Any,
    ) -> None:
        super().__init__(default_collection=default_collection, batching=batching)
        if (url is None) == (pool is None):
            raise TypeError("PostgreSQLStore needs either a URL or pool=, not both")
        if pool is not None and not isinstance(pool, asyncpg.Pool):
            raise TypeError(f"pool must be an asyncpg.Pool, not {type(pool).__name__}")
        if pool is not None and pool_options:
            raise TypeError(f"options for a pool the store creates, with pool=: {', '.join(pool_options)}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self.table, index = _quoted_table(table)
        self._sql = _Statements(self.table, index)
        self._url = url
        self._timeout = timeout
        self._pool_options: dict[str, Any] = {
            "min_size": 0,  # connect on demand: a store made while the server is down still opens
            "max_size": max_connections,
            "statement_cache_size": statement_cache_size,
            "timeout": timeout,  # connecting
            "reset": _keep_session,
            **pool_options,
        }
        self._owns_pool = pool is None
        self.pool = pool
        self._ready_pool: asyncpg.Pool[Any] | None = None  # the pool, once the schema is checked
        self._opening = asyncio.Lock()
        self._sweep_interval = sweep_interval
        self._next_sweep = 0.0
        self._names = RowNames()
        self._releasing: set[asyncio.Task[None]] = set()
        self._lock_id = int.from_bytes(digest(f"kvstores {self.table}".encode())[:8], "big", signed=True)

    # -- connection ------------------------------------------------------------------

    async def _ready(self) -> asyncpg.Pool[Any]:
        """The pool, created on first use, with the table created and its version checked (run by _query)."""
        async with self._opening:
            self._check_open()
            if self._ready_pool is None:
                if self.pool is None:
                    self.pool = await asyncpg.create_pool(self._url, **self._pool_options)
                    await self._release_with_loop()
                await self._check_schema(self.pool)
                self._ready_pool = self.pool
        return self._ready_pool

    async def _check_schema(self, pool: asyncpg.Pool[Any]) -> None:
        async with pool.acquire() as connection:
            try:
                version = await connection.fetchval(self._sql.get, *VERSION_ROW)
            except pg_errors.UndefinedTableError:
                version = None
            if version is None:  # a new table (or one made by hand without the row)
                async with connection.transaction():
                    await connection.execute("SELECT pg_advisory_xact_lock($1)", self._lock_id)
                    if await connection.fetchval("SELECT to_regclass($1) IS NULL", self.table):
                        for statement in self._sql.create:
                            await connection.execute(statement)
                    await connection.execute(self._sql.add_version, *VERSION_ROW, str(SCHEMA_VERSION))
                version = await connection.fetchval(self._sql.get, *VERSION_ROW)
        if version != str(SCHEMA_VERSION):
            raise KVStoreError(
                f"PostgreSQL table {self.table} holds kvstores schema version {version}; "
                f"this kvstores reads version {SCHEMA_VERSION}"
            )

    def _holds_connection(self) -> bool:
        return self._owns_pool and self.pool is not None

    def _server_address(self) -> tuple[str, int] | None:
        if self._url is None:
            return None  # a pool the user made: its address is asyncpg's to know
        parts = urlsplit(self._url)
        return (parts.hostname or "localhost", parts.port or 5432)

    def _translate(self, exc: Exception) -> KVStoreError | None:
        return _translated_error(exc)

    async def _close(self) -> None:
        async with self._opening:
            pool, self._ready_pool = self.pool, None
            if self._owns_pool and pool is not None:
                self.pool = None
                try:
                    async with deadline(self._timeout):
                        await pool.close()
                except Exception:  # an unreachable or hung server: drop the connections
                    pool.terminate()

    async def _query(self, kind: str, sql: str, *args: Any) -> Any:
        """Run ``sql`` on a pool connection with asyncpg's ``kind`` method (fetch, fetchval...)."""
        async with deadline(self._timeout):  # first use included: waiting for another opener too
            pool = self._ready_pool or await self._ready()
            connection: Any = await pool.acquire()
            try:
                for attempt in range(_DEADLOCK_ATTEMPTS):
                    try:
                        return await getattr(connection, kind)(sql, *args)
                    except pg_errors.DeadlockDetectedError:
                        # the server rolled this one statement back: running it again is exact
                        if attempt == _DEADLOCK_ATTEMPTS - 1:
                            raise
            except _BROKEN:
                # the connection may be left mid-protocol: drop it (the pool connects anew),
                # since the pool's reset no longer probes it
                with contextlib.suppress(pg_errors.InterfaceError):  # already dropped by asyncpg
                    connection.terminate()
                raise
            except asyncio.CancelledError:
                # our deadline or the caller's cancel: asyncpg is cancelling the statement on the
                # server; the connection returns to the pool once that is confirmed (or is dropped
                # after ``timeout``), off the caller's time
                self._release_later(pool, connection)
                connection = None
                raise
            finally:
                if connection is not None:
                    await pool.release(connection, timeout=self._timeout)

    def _release_later(self, pool: asyncpg.Pool[Any], connection: Any) -> None:
        task = asyncio.get_running_loop().create_task(_release_quietly(pool, connection, self._timeout))
        self._releasing.add(task)  # a strong reference until it is done
        task.add_done_callback(self._releasing.discard)

    async def _sweep_when_due(self) -> None:
        """Delete a batch of expired rows, at most every ``sweep_interval`` seconds (run with writes)."""
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + self._sweep_interval
            status: str = await self._query("execute", self._sql.sweep)
            if status == f"DELETE {_SWEEP_BATCH}":  # more to do: sweep again at the next write
                self._next_sweep = now

    # -- primitives ------------------------------------------------------------------

    async def _get(self, collection: str, key: str) -> str | None:
        text: str | None = await self._query("fetchval", self._sql.get, *self._names.row(collection, key))
        return text

    async def _ttl(self, collection: str, key: str) -> tuple[str | None, float | None]:
        row = await self._query("fetchrow", self._sql.ttl, *self._names.row(collection, key))
        return (None, None) if row is None else (row[0], row[1])

    async def _select_many(
        self, sql: str, collection: str, keys: Sequence[str]
    ) -> tuple[list[bytes], dict[bytes, Any]]:
        """The keys as UTF-8 and the live rows of ``sql`` by key."""
        collection_id, name = self._names.collection(collection)
        encoded = [key.encode() for key in keys]
        rows = await self._query("fetch", sql, collection_id, [digest(key) for key in encoded], name)
        return encoded, {row[0]: row for row in rows}

    async def _get_many(self, collection: str, keys: Sequence[str]) -> list[str | None]:
        encoded, found = await self._select_many(self._sql.get_many, collection, keys)
        return [None if (row := found.get(key)) is None else row[1] for key in encoded]

    async def _get_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[str | None]:
        columns = list(zip(*(self._names.row(collection, key) for collection, key in pairs)))
        rows = await self._query("fetch", self._sql.get_pairs, *map(list, columns))
        found: list[str | None] = [None] * len(pairs)
        for position, text in rows:
            found[position - 1] = text
        return found

    async def _put_entries(self, entries: Sequence[Entry]) -> None:
        await self._sweep_when_due()
        # in (collection_id, key_id) order, as every bulk write locks rows: no deadlock between them
        rows = sorted((*self._names.row(collection, key), text, ttl) for collection, key, text, ttl in entries)
        await self._query("execute", self._sql.put_entries, *map(list, zip(*rows)))

    async def _ttl_many(self, collection: str, keys: Sequence[str]) -> list[tuple[str | None, float | None]]:
        encoded, found = await self._select_many(self._sql.ttl_many, collection, keys)
        return [(None, None) if (row := found.get(key)) is None else (row[1], row[2]) for key in encoded]

    async def _put(self, collection: str, key: str, text: str, ttl: float | None) -> None:
        await self._sweep_when_due()
        await self._query("execute", self._sql.put, *self._names.row(collection, key), text, ttl)

    async def _put_many(self, collection: str, keys: Sequence[str], texts: list[str], ttl: float | None) -> None:
        await self._sweep_when_due()
        collection_id, name = self._names.collection(collection)
        rows = sorted((digest(key.encode()), key.encode(), text) for key, text in zip(keys, texts))
        ids, encoded, ordered = (list(column) for column in zip(*rows))
        await self._query("execute", self._sql.put_many, collection_id, name, ids, encoded, ordered, ttl)

    async def _delete(self, collection: str, key: str) -> bool:
        return bool(await self._query("fetchval", self._sql.delete, *self._names.row(collection, key)))

    async def _delete_many(self, collection: str, keys: Sequence[str]) -> int:
        collection_id, name = self._names.collection(collection)
        rows = sorted((digest(key.encode()), key.encode()) for key in keys)
        ids, encoded = (list(column) for column in zip(*rows))
        count: int = await self._query("fetchval", self._sql.delete_many, collection_id, ids, name, encoded)
        return count

    async def _keys(self, collection: str, limit: int | None) -> list[str]:
        rows = await self._query("fetch", self._sql.keys, *self._names.collection(collection), limit)
        return [key for (raw,) in rows if (key := decoded(raw)) is not None]

    async def _collections(self, limit: int | None) -> list[str]:
        rows = await self._query("fetch", self._sql.collections, limit)
        return [name for (raw,) in rows if (name := decoded(raw)) is not None]

    async def _destroy_collection(self, collection: str) -> bool:
        return bool(await self._query("fetchval", self._sql.destroy_collection, *self._names.collection(collection)))

    async def _destroy(self) -> bool:
        return bool(await self._query("fetchval", self._sql.destroy))

    async def _cull(self) -> None:
        await self._query("execute", self._sql.cull)

    async def _swap(
        self, collection: str, key: str, expected: Stored | None, text: str | None, ttl: float | None
    ) -> bool:
        row = self._names.row(collection, key)
        if isinstance(expected, bytes):
            expected = expected.decode()
        if expected is None and text is None:  # delete what is absent: done while it stays absent
            return bool(await self._query("fetchval", self._sql.is_absent, *row))
        if expected is None:
            await self._sweep_when_due()
            return bool(await self._query("fetchval", self._sql.insert_if_absent, *row, text, ttl))
        if text is None:
            return bool(await self._query("fetchval", self._sql.delete_if, *row, expected))
        return bool(await self._query("fetchval", self._sql.replace_if, *row, text, ttl, expected))

    async def _pop(self, collection: str, key: str) -> str | None:
        found = await self._query("fetchrow", self._sql.pop, *self._names.row(collection, key))
        return found[0] if found is not None and found[1] else None
