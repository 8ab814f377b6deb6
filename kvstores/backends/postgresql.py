"""PostgreSQLStore: a persistent store in one PostgreSQL table, on asyncpg's connection pool.

The table, as kvstores.backends._sql describes it (the shared layout, expiry, options and errors)::

    CREATE TABLE "kvstores_entries" (
        collection_id bytea NOT NULL,   -- sha256(UTF-8 collection name)
        key_id        bytea NOT NULL,   -- sha256(UTF-8 key)
        collection    bytea NOT NULL,   -- the UTF-8 collection name, in full
        key           bytea NOT NULL,   -- the UTF-8 key, in full
        value         text NOT NULL,    -- the entry's JSON text, exactly as kvstores encoded it
        expires_at    timestamptz,      -- NULL: never expires
        PRIMARY KEY (collection_id, key_id));
    CREATE INDEX "kvstores_entries_expiry" ON "kvstores_entries" (expires_at) WHERE expires_at IS NOT NULL;

Names are ``bytea`` because PostgreSQL ``text`` cannot hold NUL, which keys may contain (read
them with ``convert_from(key, 'UTF8')``). The value is ``text`` rather than ``jsonb``: ``jsonb``
would reorder keys, reject ``\\u0000`` in strings and parse every value on the server. Expiry
is ``now() + ttl``; sweeps take ``FOR UPDATE SKIP LOCKED`` rows, so concurrent sweepers never
wait on each other. Bulk calls pass arrays (``key_id = ANY($2)``, ``unnest(...)``): one
statement for any number of keys, so put_many is all or nothing; put_if_absent is ``INSERT ...
ON CONFLICT DO UPDATE ... WHERE <the row has expired>``; pop is ``DELETE ... RETURNING``. Row
locks and PostgreSQL's re-check of the WHERE clause on the newest row version make each
statement atomic against every other client. The table is created under a transaction-level
advisory lock; a least-privileged role owns the table (``ALTER TABLE ... OWNER TO``) or has
the four rights on it, and USAGE on its schema.

URLs: ``postgresql://user:password@host:5432/database`` (or ``postgres://``), passed to asyncpg
unchanged apart from the store's own query options, so libpq-style options work
(``?sslmode=verify-full``, ``?target_session_attrs=read-write``) and any other query option is
a server setting (``?search_path=app``). ``table``: the name at most 55 characters (room for
its index's name). ``statement_cache_size``: default 100; set 0 behind PgBouncer in
transaction mode (asyncpg then uses unnamed statements, a second round trip per call). Other
keyword options go to ``asyncpg.create_pool`` (e.g. ``ssl=``, ``server_settings=``). Or pass
``pool=`` an ``asyncpg.Pool`` you own: the store never closes it, and its own settings (size,
statement cache, reset) apply. The database should use the UTF8 encoding.

The store's own pool connects on demand and skips asyncpg's per-release session reset (a round
trip per call: the store's statements leave no session state behind). A statement cancelled or
timed out (``statement_timeout``, ``lock_timeout``), a server starting, shutting down or full
raise StoreConnectionError; a timed-out statement is cancelled on the server. Importing this module
quiets one asyncpg defect process-wide: a TLS probe cut short by a cancel no longer logs "Future
exception was never retrieved" (kvstores.backends._asyncpg_fix).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from kvstores._optional import missing_extra
from kvstores.backends import _sql
from kvstores.backends._sql import DEFAULT_TABLE, SCHEMA_VERSION, SQLServerStore, Statements, digest

try:
    import asyncpg
    from asyncpg import exceptions as pg_errors
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("asyncpg", "postgresql") from exc

from kvstores.backends._asyncpg_fix import quiet_cut_tls_probes  # after the check: it imports asyncpg

quiet_cut_tls_probes()

if TYPE_CHECKING:
    from kvstores._signal_host import Sink, Transport

__all__ = ["DEFAULT_TABLE", "SCHEMA_VERSION", "PostgreSQLStore"]

_LOST = (
    OSError,  # refused, reset, unreachable, TLS failures; TimeoutError (our deadline) too
    pg_errors.PostgresConnectionError,  # class 08: the connection failed or was lost mid-call
    pg_errors.InternalClientError,  # a connection the server dropped, caught mid-protocol
)
_UNREACHABLE = (
    *_LOST,
    pg_errors.OperatorInterventionError,  # class 57: shutdown, starting up, statement timeout, cancel
    pg_errors.TooManyConnectionsError,
    pg_errors.LockNotAvailableError,  # lock_timeout
)
_BROKEN = (  # errors after which a connection may be unusable (a clean SQL error leaves it fine)
    *_LOST,
    pg_errors.AdminShutdownError,
    pg_errors.CrashShutdownError,
    pg_errors.IdleSessionTimeoutError,
    pg_errors.InterfaceError,
)
_CONNECTION_CLOSED = "the underlying connection is closed"  # asyncpg's InterfaceError for a lost connection

_LISTEN_ONLY: Final = frozenset(  # pool options that a connection of its own does not take
    {"min_size", "max_size", "max_queries", "max_inactive_connection_lifetime", "setup", "init", "reset"}
)


async def _keep_session(connection: asyncpg.Connection[Any]) -> None:
    """Release a pool connection as it is (an open transaction is still rolled back): see the module."""


class _Statements(Statements):
    """The SQL of one table, built once per store."""

    key, now, placeholder = "key", "now()", "${}"
    remaining, expiry_of = "date_part('epoch', expires_at - now())", "now() + {}::float8 * interval '1 second'"

    def __init__(self, table: str) -> None:
        super().__init__(table)
        live, columns = self.live, self.columns
        index = f'"{table.rpartition(".")[2][1:-1]}_expiry"'
        upsert = (
            "ON CONFLICT (collection_id, key_id) DO UPDATE SET value = EXCLUDED.value,"
            " expires_at = EXCLUDED.expires_at"
            f" WHERE {table}.collection = EXCLUDED.collection AND {table}.key = EXCLUDED.key"
        )
        values = f"VALUES ($1, $2, $3, $4, $5, {self.expiry('$6')}) {upsert}"
        self.create = (
            f"CREATE TABLE {table} (collection_id bytea NOT NULL, key_id bytea NOT NULL, collection bytea NOT NULL,"
            " key bytea NOT NULL, value text NOT NULL, expires_at timestamptz, PRIMARY KEY (collection_id, key_id))",
            f"CREATE INDEX {index} ON {table} (expires_at) WHERE expires_at IS NOT NULL",
        )
        self.add_version = (
            f"INSERT INTO {table} {columns} VALUES ($1, $2, $3, $4, $5, NULL)"
            " ON CONFLICT (collection_id, key_id) DO NOTHING"
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
        self.put = f"INSERT INTO {table} {columns} {values}"
        self.delete_many = (
            f"WITH locked AS (SELECT t.key_id FROM {table} AS t"
            " JOIN unnest($2::bytea[], $4::bytea[]) AS u(key_id, key) ON t.key_id = u.key_id AND t.key = u.key"
            " WHERE t.collection_id = $1 AND t.collection = $3 ORDER BY t.key_id FOR UPDATE OF t),"
            f" gone AS (DELETE FROM {table} AS t USING locked WHERE t.collection_id = $1 AND t.key_id = locked.key_id"
            " RETURNING t.expires_at)"
            f" SELECT count(*) FROM gone WHERE {live}"
        )
        self.sweep = (
            f"DELETE FROM {table} WHERE (collection_id, key_id) IN (SELECT collection_id, key_id FROM {table}"
            f" WHERE expires_at <= now() LIMIT {self.sweep_batch} FOR UPDATE SKIP LOCKED)"
        )
        self.insert_if_absent = f"INSERT INTO {table} {columns} {values} AND {table}.expires_at <= now()"

    def select_many(self, columns: str) -> str:
        """SELECT ``key`` and ``columns`` of the live rows of one collection whose key_id is in an array."""
        return (
            f"SELECT key, {columns} FROM {self.table}"
            f" WHERE collection_id = $1 AND key_id = ANY($2::bytea[]) AND collection = $3 AND {self.live}"
        )


class PostgreSQLStore(SQLServerStore):
    """A persistent store in one PostgreSQL table, shared by every process that opens it."""

    db_system = "postgresql"
    label = "PostgreSQL"
    statement_cache_default = 100
    pool: asyncpg.Pool[Any] | None = None
    _quote = '"'
    _scope = "schema"
    _max_part = 63
    _max_name = 55  # leaves room for the index name "<table>_expiry" within 63 bytes
    _driver_errors = (pg_errors.PostgresError, pg_errors.InterfaceError, ValueError)  # ValueError: DSNs, encoders
    statements = _Statements
    _sql: _Statements

    def __init__(self, url: str | None = None, *, pool: asyncpg.Pool[Any] | None = None, **options: Any) -> None:
        """A store on ``url``, or on ``pool`` (yours: never closed by the store); options: see the module."""
        if (url is None) == (pool is None):
            raise TypeError("PostgreSQLStore needs either a URL or pool=, not both")
        if pool is not None and not isinstance(pool, asyncpg.Pool):
            raise TypeError(f"pool must be an asyncpg.Pool, not {type(pool).__name__}")
        self._owns_pool = pool is None
        self.pool = pool
        super().__init__(url, **options)
        self._lock_id = int.from_bytes(digest(f"kvstores {self.table}".encode())[:8], "big", signed=True)

    def _configure(self, url: str | None, max_connections: int, statement_cache_size: int, options: Any) -> None:
        if not self._owns_pool and options:
            raise TypeError(f"options for a pool the store creates, with pool=: {', '.join(options)}")
        self._pool_options: dict[str, Any] = {
            "min_size": 0,  # connect on demand: a store made while the server is down still opens
            "max_size": max_connections,
            "statement_cache_size": statement_cache_size,
            "timeout": self._timeout,  # connecting
            "reset": _keep_session,
            **options,
        }

    # -- the driver ------------------------------------------------------------------

    async def _create_pool(self) -> asyncpg.Pool[Any]:
        return await asyncpg.create_pool(self._url, **self._pool_options)

    async def _read_version(self, connection: Any, row: Sequence[bytes]) -> str | None:
        try:
            version: str | None = await connection.fetchval(self._sql.version, *row)
        except pg_errors.UndefinedTableError:
            return None
        return version

    async def _create_table(self, connection: Any, version: Sequence[Any]) -> None:
        async with connection.transaction():
            await connection.execute("SELECT pg_advisory_xact_lock($1)", self._lock_id)
            if await connection.fetchval("SELECT to_regclass($1) IS NULL", self.table):
                for statement in self._sql.create:
                    await connection.execute(statement)
            await connection.execute(self._sql.add_version, *version)

    async def _release(self, pool: asyncpg.Pool[Any], connection: Any) -> None:
        await pool.release(connection, timeout=self._timeout)

    def _abandon(self, pool: asyncpg.Pool[Any], connection: Any) -> Callable[[], None] | None:
        # asyncpg is cancelling the statement on the server; the connection returns to the pool
        # once that is confirmed (or is dropped after ``timeout``), off the caller's time
        self._in_background(self._release(pool, connection))
        return None

    def _drop(self, connection: Any) -> None:
        # the connection may be left mid-protocol, and the pool's reset no longer probes it
        with contextlib.suppress(pg_errors.InterfaceError):  # already dropped by asyncpg
            connection.terminate()

    @staticmethod
    def _is_deadlock(exc: Exception) -> bool:
        return isinstance(exc, pg_errors.DeadlockDetectedError)

    @staticmethod
    def _is_broken(exc: BaseException) -> bool:
        return isinstance(exc, _BROKEN)

    @staticmethod
    def _is_unreachable(exc: Exception) -> bool:
        # asyncpg reports a connection lost under a transaction as a plain InterfaceError
        return isinstance(exc, _UNREACHABLE) or (
            isinstance(exc, pg_errors.InterfaceError) and _CONNECTION_CLOSED in str(exc)
        )

    async def fetch(self, sql: str, *args: Any) -> Sequence[Sequence[Any]]:
        rows: list[Any] = await self._run(lambda connection: connection.fetch(sql, *args))
        return rows

    async def _count(self, sql: str, *args: Any) -> int:
        status: str = await self._run(lambda connection: connection.execute(sql, *args))
        return int(status.rpartition(" ")[2])  # "DELETE 3", "INSERT 0 1", "UPDATE 0"

    def _server_address(self) -> tuple[str, int] | None:
        if self._url is None:
            return None  # a pool the user made: its address is asyncpg's to know
        parts = urlsplit(self._url)
        return (parts.hostname or "localhost", parts.port or 5432)

    async def listener(self) -> tuple[Any, asyncpg.Pool[Any] | None]:
        """A connection for LISTEN (its signal transport's), and the pool to release it to.

        A connection of its own, outside the store's pool (None: close it when done), or one
        from the pool the user passed in, which the store never creates connections beside.
        """
        if not self._owns_pool and self.pool is not None:
            return await self.pool.acquire(), self.pool
        options = {name: value for name, value in self._pool_options.items() if name not in _LISTEN_ONLY}
        return await asyncpg.connect(self._url, **options), None

    def _signal_transport(self, sink: Sink) -> Transport[Any]:
        from kvstores.backends._postgresql_signals import PostgreSQLTransport  # only a store that signals loads it

        return PostgreSQLTransport(self, sink, timeout=self._timeout)

    # -- primitives ------------------------------------------------------------------

    async def _select_rows(
        self, columns: str, collection: tuple[bytes, bytes], key_ids: list[bytes]
    ) -> Sequence[Sequence[Any]]:
        collection_id, name = collection
        return await self.fetch(self._sql.select_many(columns), collection_id, key_ids, name)

    async def _get_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[str | None]:
        columns = list(zip(*(_sql.row_ids(collection, key) for collection, key in pairs)))
        rows = await self.fetch(self._sql.get_pairs, *map(list, columns))
        found: list[str | None] = [None] * len(pairs)
        for position, text in rows:
            found[position - 1] = text
        return found

    async def _upsert(self, rows: list[tuple[Any, ...]]) -> None:
        await self._count(self._sql.put_entries, *map(list, zip(*rows)))  # one statement, any number of rows

    async def _delete_rows(self, collection: tuple[bytes, bytes], pairs: list[tuple[bytes, bytes]]) -> int:
        ids, encoded = (list(column) for column in zip(*pairs))
        return int(await self._value(self._sql.delete_many, collection[0], ids, collection[1], encoded))
