"""MySQLStore: a persistent store in one MariaDB or MySQL table, on asyncmy's connection pool.

Layout (schema version 1; ``kvstores_entries`` by default, or the ``table`` option)::

    CREATE TABLE `kvstores_entries` (
        collection_id BINARY(32) NOT NULL,      -- sha256(UTF-8 collection name)
        key_id        BINARY(32) NOT NULL,      -- sha256(UTF-8 key)
        collection    VARBINARY(4096) NOT NULL, -- the UTF-8 collection name, in full
        `key`         VARBINARY(4096) NOT NULL, -- the UTF-8 key, in full
        value         LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        expires_at    DATETIME(6) NULL,         -- UTC, from the server's clock; NULL: never expires
        PRIMARY KEY (collection_id, key_id),
        KEY expiry (expires_at)) ENGINE=InnoDB;

Names can be 1,024 characters, up to 4 KiB of UTF-8 each, and InnoDB's index entries hold at
most 3,072 bytes: so the primary key is a pair of fixed-size SHA-256 digests (as in
kvstores.backends.postgresql), and the full names are stored beside them and compared too,
so a pair's row is found by the index and matched exactly. Names are ``VARBINARY``: NUL,
case and NFC vs NFD stay distinct, and no collation pads or folds them. Values are the JSON
text kvstores encoded, in a binary-collated utf8mb4 ``LONGTEXT`` (4-byte characters kept). The
row with the empty collection (no kvstores collection is empty) holds the schema version; a
table of another version raises KVStoreError rather than being misread.

Expiry uses the server's clock: ``expires_at = UTC_TIMESTAMP(6) + INTERVAL ttl MICROSECOND``
(in UTC, so no session or server time zone changes it) and every read filters ``expires_at >
UTC_TIMESTAMP(6)``, so every client agrees whatever its own clock says. Expired rows are
invisible at once; writes delete up to 1,000 of them at most every ``sweep_interval`` seconds
(default 60; again at the next write while a sweep finds a full batch), and ``cull()`` deletes
all of them, through the ``expiry`` index.

Statements (autocommit, one round trip each): get/ttl = SELECT by the primary key;
get_many/ttl_many = SELECT ... ``key_id IN (...)``, 1,000 keys a statement; put and put_many
= ``INSERT ... ON DUPLICATE KEY UPDATE`` (put_many: one multi-row statement per 1,000 rows or
4 MiB, all of them in one transaction when there are several, so all or nothing);
delete/delete_many = ``DELETE`` of the live rows (an expired one is left to the sweep);
put_if_absent = ``INSERT ... ON DUPLICATE KEY UPDATE`` that takes over only an expired row;
update's compare-and-set = ``UPDATE`` (or ``DELETE``) ``... WHERE value = <the text read> AND
<live>``; pop = ``DELETE ... RETURNING value`` on MariaDB (on MySQL, which has no RETURNING,
a read then that compare-and-delete, retried on a lost race). Bulk writes lock their rows in
primary-key order (rows are sent sorted by digest), so overlapping ones queue rather than
deadlock; a statement (or put_many's transaction) the server still picks as a deadlock
victim runs again, up to 3 times. No lock is ever held while the caller's code runs.

The table is created on first use when missing, under a named lock (``GET_LOCK``), so several
processes starting at once create it once. Least privilege: when the table exists, the store
issues no DDL at all, so a user with only SELECT, INSERT, UPDATE and DELETE on that table
works: create the table once as a privileged user (open a store with it, or run the DDL
above and insert the version row), then grant those four to the application's user.
``destroy()`` deletes the store's rows, never the table or anything else.

Driver: asyncmy (the ``mysql`` extra). It keeps aiomysql's API and pool, but its protocol,
pool and row parsing are compiled with Cython (about twice aiomysql's speed on point
queries), it ships Python 3.11 wheels (manylinux, macOS, Windows) and type stubs, it is
released regularly, and it offers a transparent cache of server-side prepared statements
(binary protocol: no escaping of parameters, fixed statement text per call shape). On a
cancelled read it closes the connection rather than handing back a desynchronised one;
neither driver cancels the statement on the server, so the store does (below). aiomysql,
pure Python on top of PyMySQL, has none of the prepared statements or the speed.

URLs: ``mysql://user:password@host:3306/database`` (or ``mariadb://``), percent-encoded
credentials; ``?unix_socket=/run/mysqld/mysqld.sock``, ``?ssl=true`` (TLS with the system's
CAs), ``?ssl_ca=``, ``?ssl_cert=``, ``?ssl_key=`` (files) and ``?program_name=`` go to the
driver; the store's own options below may be given in the query as well; any other query
option is an error.

Options: ``table`` (``name`` or ``database.name``, letters, digits and ``_``, at most 64
characters each; always quoted); ``timeout`` (default 5 s: bounds each call as a whole:
waiting for a free pool connection, connecting and the statement; past it, or when the
server refuses, shuts down, kills or times out the statement (``max_statement_time``,
``innodb_lock_wait_timeout``), StoreConnectionError); ``max_connections`` (default 10: the
pool's size); ``statement_cache_size`` (default 128 prepared statements per connection; 0
sends every statement as text, e.g. behind a proxy that cannot route prepared statements);
``sweep_interval``; ``default_collection``; ``batching`` (concurrent single-key gets and puts
ride together in one statement; on unless ``KVSTORES_BATCHING=off``); other keyword options
go to ``asyncmy.connect`` (e.g. ``ssl=`` an SSLContext, ``init_command=``).

Server requirements: InnoDB; ``max_allowed_packet`` of at least 32 MiB (64 MiB advised) so
that a value of the largest size kvstores accepts (just under 16 MiB of JSON) travels in one
statement and one result row: MariaDB's default (16 MiB) is too small for those values only.

Errors: a refused or lost connection, a server shutting down, a full server, a statement
killed or timed out and the store's own deadline raise StoreConnectionError with asyncmy's
error as ``__cause__``; a connection left broken or mid-statement (a call cancelled) is
dropped, and a statement whose call timed out is killed on the server (``KILL``, on a
connection of its own: a user may kill its own connections without any privilege) so that
it holds no lock afterwards; the pool connects anew for the next call, and the same store
object works again once the server is back. Any other asyncmy error raises KVStoreError.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from kvstores._codec import ttl_milliseconds
from kvstores._optional import missing_extra
from kvstores._urls import flag
from kvstores.backends._rows import VERSION_ROW, RowNames, decoded, digest
from kvstores.base import DEFAULT_COLLECTION, BaseStore, Entry, Stored, chunks, deadline
from kvstores.errors import ConflictError, KVStoreError, StoreConnectionError

try:
    import asyncmy
    from asyncmy import errors as my_errors
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("asyncmy", "mysql") from exc


__all__ = ["DEFAULT_TABLE", "SCHEMA_VERSION", "MySQLStore"]

T = TypeVar("T")

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
_DRIVER_QUERY_OPTIONS = ("unix_socket", "ssl", "ssl_ca", "ssl_cert", "ssl_key", "program_name")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_CHUNK: Final = 1_000  # keys or rows per bulk statement
_CHUNK_BYTES: Final = 4 * 1024 * 1024  # encoded values per put_many statement (a single value may exceed it)
_SWEEP_BATCH: Final = 1_000
_DEADLOCK_ATTEMPTS: Final = 3  # a statement (or transaction) the server chose as a deadlock victim runs again
_POP_ATTEMPTS: Final = 100  # MySQL's read-then-compare-and-delete pop, racing other writers
_LOCK_WAIT: Final = 30  # seconds GET_LOCK waits for another process creating the table
_UpsertRow = tuple[bytes, bytes, bytes, bytes, str, "int | None"]  # the columns of one upserted row
_NO_LIMIT: Final = 2**64 - 1

_DEADLOCK: Final = 1213  # ER_LOCK_DEADLOCK: the server rolled the statement or transaction back
_NO_SUCH_TABLE: Final = 1146
_UNREACHABLE_CODES = frozenset(
    {
        1040,  # ER_CON_COUNT_ERROR: too many connections
        1053,  # ER_SERVER_SHUTDOWN
        1205,  # ER_LOCK_WAIT_TIMEOUT (innodb_lock_wait_timeout)
        1317,  # ER_QUERY_INTERRUPTED: KILL QUERY
        1927,  # ER_CONNECTION_KILLED (MariaDB)
        1969,  # ER_STATEMENT_TIMEOUT (MariaDB max_statement_time)
        3024,  # ER_QUERY_TIMEOUT (MySQL max_execution_time)
        4031,  # ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8: disconnected for inactivity)
    }
)
_CLIENT_ERRORS: Final = range(2000, 3000)  # CR_*: raised by the driver (connection refused, lost, gone away...)


def _code(exc: BaseException) -> int | None:
    """The MySQL error number of an asyncmy error, if it carries one."""
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _unreachable(exc: BaseException) -> bool:
    """True for errors that mean the server cannot be had (now): StoreConnectionError."""
    if isinstance(exc, (OSError, my_errors.InterfaceError)):  # refused, reset, TLS; TimeoutError (our deadline)
        return True
    code = _code(exc)
    return (
        isinstance(exc, my_errors.MySQLError)
        and code is not None
        and (code in _UNREACHABLE_CODES or code in _CLIENT_ERRORS)
    )


def _broken(exc: BaseException) -> bool:
    """True for errors after which a connection may be unusable (a clean SQL error leaves it fine)."""
    code = _code(exc)
    return (
        not isinstance(exc, my_errors.MySQLError)
        or isinstance(exc, my_errors.InterfaceError)
        or (code is not None and (code in _CLIENT_ERRORS or code in (1053, 1927, 4031)))
    )


def _translated_error(exc: Exception) -> KVStoreError | None:
    """Translate asyncmy errors: the one place this backend does it."""
    if _unreachable(exc):
        return StoreConnectionError(f"MySQL: {type(exc).__name__}: {exc}")
    if isinstance(exc, (my_errors.MySQLError, ValueError, TypeError)):
        # ValueError, TypeError: the driver's argument checks (e.g. an ssl option)
        return KVStoreError(f"MySQL: {type(exc).__name__}: {exc}")
    return None


def _quoted_table(table: str) -> str:
    """The quoted, validated table name."""
    if not isinstance(table, str):
        raise TypeError(f"table must be a str, not {type(table).__name__}")
    parts = table.split(".")
    if len(parts) > 2 or not all(_IDENTIFIER.fullmatch(part) for part in parts):
        raise ValueError(
            f"table must be 'name' or 'database.name' of letters, digits and '_' (at most 64 characters each),"
            f" got {table!r}"
        )
    return ".".join(f"`{part}`" for part in parts)


def _micros(ttl: float | None) -> int | None:
    """The TTL in microseconds, rounded up to whole milliseconds (None: never expires)."""
    return None if ttl is None else ttl_milliseconds(ttl) * 1000


def _seconds(micros: int | None) -> float | None:
    return None if micros is None else micros / 1e6


def _bucket(count: int) -> int:
    """``count`` rounded up to a power of two (at most _CHUNK): bulk statements come in few shapes,
    so each is prepared once per connection."""
    return min(_CHUNK, 1 << (count - 1).bit_length())


def _connect_options(url: str, query: dict[str, str]) -> dict[str, Any]:
    """asyncmy.connect's keyword arguments for ``mysql://user:password@host:port/database?...``."""
    parts = urlsplit(url)
    options: dict[str, Any] = {
        "host": parts.hostname or "localhost",
        "port": parts.port or 3306,
        "user": unquote(parts.username) if parts.username else None,
        "password": unquote(parts.password or ""),
        "database": unquote(parts.path.lstrip("/")) or None,
    }
    ssl: dict[str, Any] = {}
    for name, value in query.items():
        if name not in _DRIVER_QUERY_OPTIONS:
            known = ", ".join([*_STORE_QUERY_OPTIONS, "batching", *_DRIVER_QUERY_OPTIONS])
            raise ValueError(f"unknown MySQL URL option {name!r}; known options: {known}")
        if name == "ssl":
            if flag(value):
                ssl.setdefault("check_hostname", True)
        elif name.startswith("ssl_"):
            ssl[name[4:]] = value
        else:
            options[name] = value
    if ssl:
        options["ssl"] = ssl
    return options


class _Statements:
    """The SQL of one table, built once per store (``%s`` placeholders)."""

    def __init__(self, table: str) -> None:
        now = "UTC_TIMESTAMP(6)"
        live = f"(expires_at IS NULL OR expires_at > {now})"
        row = "collection_id = %s AND key_id = %s AND collection = %s AND `key` = %s"
        self.expiry = f"{now} + INTERVAL %s MICROSECOND"
        columns = "(collection_id, key_id, collection, `key`, value, expires_at)"
        self.values = f"(%s, %s, %s, %s, %s, {self.expiry})"
        same = "collection = VALUES(collection) AND `key` = VALUES(`key`)"  # never a digest collision
        # expires_at is assigned last: MySQL evaluates the assignments in order, on the updated row
        self.upsert = (
            f" ON DUPLICATE KEY UPDATE value = IF({same}, VALUES(value), value),"
            f" expires_at = IF({same}, VALUES(expires_at), expires_at)"
        )
        self.insert = f"INSERT INTO {table} {columns} VALUES "
        self.live = live
        self.table = table
        self.create = (
            f"CREATE TABLE IF NOT EXISTS {table} (collection_id BINARY(32) NOT NULL, key_id BINARY(32) NOT NULL,"
            " collection VARBINARY(4096) NOT NULL, `key` VARBINARY(4096) NOT NULL,"
            " value LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, expires_at DATETIME(6) NULL,"
            " PRIMARY KEY (collection_id, key_id), KEY expiry (expires_at))"
            " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        )
        self.probe = f"SELECT 1 FROM {table} LIMIT 0"
        self.add_version = (
            f"INSERT INTO {table} {columns} VALUES (%s, %s, %s, %s, %s, NULL)"
            " ON DUPLICATE KEY UPDATE collection_id = collection_id"
        )
        self.version = f"SELECT value FROM {table} WHERE {row}"
        self.get = f"SELECT value FROM {table} WHERE {row} AND {live}"
        remaining = f"TIMESTAMPDIFF(MICROSECOND, {now}, expires_at)"
        self.ttl = f"SELECT value, {remaining} FROM {table} WHERE {row} AND {live}"
        self.put = f"{self.insert}{self.values}{self.upsert}"
        self.delete = f"DELETE FROM {table} WHERE {row} AND {live}"
        self.keys = (
            f"SELECT `key` FROM {table} WHERE collection_id = %s AND collection = %s AND {live} ORDER BY `key` LIMIT %s"
        )
        self.collections = (
            f"SELECT DISTINCT collection FROM {table} WHERE collection <> '' AND {live} ORDER BY collection LIMIT %s"
        )
        self.destroy_collection_live = f"DELETE FROM {table} WHERE collection_id = %s AND collection = %s AND {live}"
        self.destroy_collection_rest = f"DELETE FROM {table} WHERE collection_id = %s AND collection = %s"
        self.destroy_live = f"DELETE FROM {table} WHERE collection <> '' AND {live}"
        self.destroy_rest = f"DELETE FROM {table} WHERE collection <> ''"
        self.cull = f"DELETE FROM {table} WHERE expires_at <= {now}"
        self.sweep = f"DELETE FROM {table} WHERE expires_at <= {now} ORDER BY expires_at LIMIT {_SWEEP_BATCH}"
        # put_if_absent: insert, or take over an expired row; a live row is left as it is (0 rows changed)
        expired = f"{same} AND expires_at <= {now}"
        self.insert_if_absent = (
            f"{self.insert}{self.values} ON DUPLICATE KEY UPDATE value = IF({expired}, VALUES(value), value),"
            f" expires_at = IF({expired}, VALUES(expires_at), expires_at)"
        )
        self.is_absent = f"SELECT NOT EXISTS (SELECT 1 FROM {table} WHERE {row} AND {live})"
        self.replace_if = (
            f"UPDATE {table} SET value = %s, expires_at = {self.expiry} WHERE {row} AND value = %s AND {live}"
        )
        self.unchanged = f"SELECT EXISTS (SELECT 1 FROM {table} WHERE {row} AND value = %s AND expires_at IS NULL)"
        self.delete_if = f"DELETE FROM {table} WHERE {row} AND value = %s AND {live}"
        self.pop = f"DELETE FROM {table} WHERE {row} AND {live} RETURNING value"
        self._select_many: dict[tuple[str, int], str] = {}
        self._puts: dict[int, str] = {}
        self._deletes: dict[int, str] = {}

    def select_many(self, columns: str, count: int) -> str:
        """SELECT ``columns`` of the live rows of one collection whose key_id is one of ``count``."""
        sql = self._select_many.get((columns, count))
        if sql is None:
            sql = self._select_many[columns, count] = (
                f"SELECT `key`, {columns} FROM {self.table} WHERE collection_id = %s"
                f" AND key_id IN ({', '.join(['%s'] * count)}) AND collection = %s AND {self.live}"
            )
        return sql

    def put_many(self, count: int) -> str:
        """Upsert ``count`` rows."""
        sql = self._puts.get(count)
        if sql is None:
            sql = self._puts[count] = f"{self.insert}{', '.join([self.values] * count)}{self.upsert}"
        return sql

    def delete_many(self, count: int) -> str:
        """Delete the live rows of ``count`` keys of one collection."""
        sql = self._deletes.get(count)
        if sql is None:
            marks = ", ".join(["%s"] * count)
            sql = self._deletes[count] = (
                f"DELETE FROM {self.table} WHERE collection_id = %s AND key_id IN ({marks})"
                f" AND collection = %s AND `key` IN ({marks}) AND {self.live}"
            )
        return sql


async def _execute(connection: Any, sql: str, args: Sequence[Any] = ()) -> tuple[int, Sequence[Any]]:
    """Run one statement; its affected-row count and its rows."""
    async with connection.cursor() as cursor:
        count: int = await cursor.execute(sql, args)
        rows: Sequence[Any] = await cursor.fetchall() if cursor.description else ()
        return count, rows


class MySQLStore(BaseStore):
    """A persistent store in one MariaDB/MySQL table, shared by every process that opens it.

    ``table`` is the quoted name of that table; ``pool`` the asyncmy pool in use, once it is.
    URLs: ``mysql://user:password@host:port/database?ssl=true`` (or ``mariadb://``).
    """

    db_system = "mysql"
    url_options = _STORE_QUERY_OPTIONS
    pool: asyncmy.Pool | None = None

    def __init__(
        self,
        url: str,
        *,
        table: str = DEFAULT_TABLE,
        timeout: float = 5.0,
        max_connections: int = 10,
        statement_cache_size: int = 128,
        sweep_interval: float = 60.0,
        default_collection: str = DEFAULT_COLLECTION,
        batching: bool | None = None,
        **connect_options: Any,
    ) -> None:
        super().__init__(default_collection=default_collection, batching=batching)
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        if statement_cache_size < 0:
            raise ValueError(f"statement_cache_size must be >= 0, got {statement_cache_size}")
        self.table = _quoted_table(table)
        self._sql = _Statements(self.table)
        url, query = _split_driver_options(url)
        self._url = url
        self._timeout = timeout
        self._padded = statement_cache_size > 0
        self._connect_options: dict[str, Any] = {
            **_connect_options(url, query),
            "minsize": 0,  # connect on demand: a store made while the server is down still opens
            "maxsize": max_connections,
            "pool_recycle": 3600,
            "connect_timeout": max(1, round(timeout)),
            "charset": "utf8mb4",
            "autocommit": True,
            "binary_prefix": True,  # digests are not UTF-8: send bytes as _binary literals
            "sql_mode": "'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'",  # and never NO_BACKSLASH_ESCAPES
            "stmt_cache_size": statement_cache_size,
            **connect_options,
        }
        self._ready_pool: asyncmy.Pool | None = None  # the pool, once the schema is checked
        self._opening = asyncio.Lock()
        self._returning = True  # MariaDB's DELETE ... RETURNING (decided on first use)
        self._sweep_interval = sweep_interval
        self._next_sweep = 0.0
        self._names = RowNames()
        self._killing: set[asyncio.Task[None]] = set()
        lock = hashlib.sha256(f"{self._connect_options.get('database')}.{self.table}".encode()).hexdigest()
        self._lock_name = f"kvstores:{lock[:48]}"

    # -- connection ------------------------------------------------------------------

    async def _ready(self) -> asyncmy.Pool:
        """The pool, created on first use, with the table created and its version checked (run by _run)."""
        async with self._opening:
            self._check_open()  # nothing reopens after aclose()
            if self._ready_pool is None:
                if self.pool is None:
                    self.pool = await asyncmy.create_pool(**self._connect_options)
                    await self._release_with_loop()
                async with self.pool.acquire() as connection:
                    self._returning = "mariadb" in connection.get_server_info().lower()
                    await self._check_schema(connection)
                self._ready_pool = self.pool
        return self._ready_pool

    async def _check_schema(self, connection: Any) -> None:
        try:
            _, rows = await _execute(connection, self._sql.version, VERSION_ROW)
        except my_errors.ProgrammingError as exc:
            if _code(exc) != _NO_SUCH_TABLE:
                raise
            rows = ()
        if not rows:  # a new table (or one made by hand without the row)
            (((locked,),)) = (await _execute(connection, "SELECT GET_LOCK(%s, %s)", (self._lock_name, _LOCK_WAIT)))[1]
            if locked != 1:
                raise StoreConnectionError(f"MySQL: another process holds lock {self._lock_name} (creating the table)")
            try:
                try:
                    await _execute(connection, self._sql.probe)
                except my_errors.ProgrammingError as exc:
                    if _code(exc) != _NO_SUCH_TABLE:
                        raise
                    await _execute(connection, self._sql.create)
                await _execute(connection, self._sql.add_version, (*VERSION_ROW, str(SCHEMA_VERSION)))
            finally:
                await _execute(connection, "DO RELEASE_LOCK(%s)", (self._lock_name,))
            _, rows = await _execute(connection, self._sql.version, VERSION_ROW)
        version = rows[0][0] if rows else None
        if version != str(SCHEMA_VERSION):
            raise KVStoreError(
                f"MySQL table {self.table} holds kvstores schema version {version}; "
                f"this kvstores reads version {SCHEMA_VERSION}"
            )

    def _holds_connection(self) -> bool:
        return self.pool is not None

    def _server_address(self) -> tuple[str, int] | None:
        return (self._connect_options["host"], self._connect_options["port"])

    def _translate(self, exc: Exception) -> KVStoreError | None:
        return _translated_error(exc)

    async def _close(self) -> None:
        async with self._opening:
            pool, self.pool, self._ready_pool = self.pool, None, None
            if pool is not None:
                pool.close()
                try:
                    async with deadline(self._timeout):
                        await pool.wait_closed()
                except Exception:  # an unreachable or hung server: drop the connections
                    pool.terminate()
        for task in list(self._killing):
            task.cancel()

    async def _run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``work(connection)`` on a pool connection, within the store's timeout, errors translated."""
        cut: int | None = None  # the server thread of a statement our deadline interrupted
        try:
            async with deadline(self._timeout):  # first use included: waiting for another opener too
                pool = self._ready_pool or await self._ready()
                try:
                    connection = await pool.acquire()
                except RuntimeError:  # asyncmy's pool is closing: aclose() ran meanwhile
                    self._check_open()
                    raise
                try:
                    for attempt in range(_DEADLOCK_ATTEMPTS):
                        try:
                            return await work(connection)
                        except my_errors.OperationalError as exc:
                            # the server rolled back this statement (or transaction): running it again is exact
                            if _code(exc) != _DEADLOCK or attempt == _DEADLOCK_ATTEMPTS - 1:
                                raise
                    raise AssertionError("unreachable")  # pragma: no cover
                except asyncio.CancelledError:
                    # our deadline or the caller's cancel: the connection is mid-protocol, drop it
                    cut = connection.thread_id()
                    connection.close()
                    raise
                except BaseException as exc:
                    if _broken(exc):
                        connection.close()  # the pool connects anew
                    raise
                finally:
                    pool.release(connection)
        except TimeoutError:
            if cut is not None:  # the statement may still run (and hold locks) on the server: kill it
                self._kill_later(cut)
            raise

    async def _query(self, sql: str, args: Sequence[Any] = ()) -> tuple[int, Sequence[Any]]:
        """One statement in autocommit: its affected-row count and its rows."""
        return await self._run(lambda connection: _execute(connection, sql, args))

    def _kill_later(self, thread: int) -> None:
        """Kill server thread ``thread`` (and its statement) from a connection of its own, in the background."""
        task = asyncio.get_running_loop().create_task(self._kill(thread))
        self._killing.add(task)  # a strong reference until it is done
        task.add_done_callback(self._killing.discard)

    async def _kill(self, thread: int) -> None:
        options = {
            name: value
            for name, value in self._connect_options.items()
            if name not in ("minsize", "maxsize", "pool_recycle")
        }
        with contextlib.suppress(Exception):
            async with deadline(self._timeout):
                connection = await asyncmy.connect(**{**options, "stmt_cache_size": 0})
                try:
                    await _execute(connection, "KILL %s", (thread,))
                finally:
                    connection.close()

    async def _sweep_when_due(self) -> None:
        """Delete a batch of expired rows, at most every ``sweep_interval`` seconds (run with writes)."""
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + self._sweep_interval
            count, _ = await self._query(self._sql.sweep)
            if count == _SWEEP_BATCH:  # more to do: sweep again at the next write
                self._next_sweep = now

    # -- names -----------------------------------------------------------------------

    def _padded_ids(self, ids: list[bytes]) -> list[bytes]:
        """``ids`` padded with copies of its last one to a statement shape that is prepared already."""
        return ids + ids[-1:] * (_bucket(len(ids)) - len(ids)) if self._padded else ids

    # -- primitives ------------------------------------------------------------------

    async def _get(self, collection: str, key: str) -> str | None:
        _, rows = await self._query(self._sql.get, self._names.row(collection, key))
        return rows[0][0] if rows else None

    async def _ttl(self, collection: str, key: str) -> tuple[str | None, float | None]:
        _, rows = await self._query(self._sql.ttl, self._names.row(collection, key))
        return (rows[0][0], _seconds(rows[0][1])) if rows else (None, None)

    async def _select_many(
        self, columns: str, collection: str, keys: Sequence[str]
    ) -> tuple[list[bytes], dict[bytes, Any]]:
        """The keys as UTF-8 and the live rows (``key``, ``columns``) by key."""
        collection_id, name = self._names.collection(collection)
        encoded = [key.encode() for key in keys]
        found: dict[bytes, Any] = {}
        for chunk in chunks(encoded, _CHUNK):
            ids = self._padded_ids([digest(key) for key in chunk])
            _, rows = await self._query(self._sql.select_many(columns, len(ids)), (collection_id, *ids, name))
            found.update((row[0], row) for row in rows)
        return encoded, found

    async def _get_many(self, collection: str, keys: Sequence[str]) -> list[str | None]:
        encoded, found = await self._select_many("value", collection, keys)
        return [None if (row := found.get(key)) is None else row[1] for key in encoded]

    async def _ttl_many(self, collection: str, keys: Sequence[str]) -> list[tuple[str | None, float | None]]:
        remaining = "value, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)"
        encoded, found = await self._select_many(remaining, collection, keys)
        return [(None, None) if (row := found.get(key)) is None else (row[1], _seconds(row[2])) for key in encoded]

    async def _put(self, collection: str, key: str, text: str, ttl: float | None) -> None:
        await self._sweep_when_due()
        await self._query(self._sql.put, (*self._names.row(collection, key), text, _micros(ttl)))

    async def _get_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[str | None]:
        # one SELECT per collection (each on the primary key), joined by UNION ALL: one round trip
        keys_by_collection: dict[str, list[str]] = {}
        for collection, key in pairs:
            keys_by_collection.setdefault(collection, []).append(key)
        parts: list[str] = []
        args: list[Any] = []
        for collection, keys in keys_by_collection.items():
            collection_id, name = self._names.collection(collection)
            ids = self._padded_ids([digest(key.encode()) for key in keys])
            parts.append(self._sql.select_many("collection, value", len(ids)))
            args += (collection_id, *ids, name)
        _, rows = await self._query(" UNION ALL ".join(parts), args)
        found = {(name, key): text for key, name, text in rows}
        return [found.get((collection.encode(), key.encode())) for collection, key in pairs]

    async def _put_many(self, collection: str, keys: Sequence[str], texts: list[str], ttl: float | None) -> None:
        await self._put_entries([(collection, key, text, ttl) for key, text in zip(keys, texts)])

    async def _put_entries(self, entries: Sequence[Entry]) -> None:
        await self._sweep_when_due()
        # in primary-key order, as every bulk write locks rows: overlapping writes queue, never deadlock
        rows = sorted((*self._names.row(collection, key), text, _micros(ttl)) for collection, key, text, ttl in entries)
        statements: list[tuple[str, list[Any]]] = []
        batch: list[_UpsertRow] = []
        size = 0
        for row in rows:
            if batch and (len(batch) == _CHUNK or size + len(row[4]) > _CHUNK_BYTES):
                statements.append(self._upsert(batch))
                batch, size = [], 0
            batch.append(row)
            size += len(row[4])
        statements.append(self._upsert(batch))
        if len(statements) == 1:
            await self._query(*statements[0])
        else:
            await self._run(lambda connection: _transaction(connection, statements))

    def _upsert(self, batch: list[_UpsertRow]) -> tuple[str, list[Any]]:
        """One multi-row upsert of ``batch``, padded to a prepared shape with its last row."""
        if self._padded:
            batch = batch + batch[-1:] * (_bucket(len(batch)) - len(batch))
        return self._sql.put_many(len(batch)), [value for row in batch for value in row]

    async def _delete(self, collection: str, key: str) -> bool:
        count, _ = await self._query(self._sql.delete, self._names.row(collection, key))
        return count > 0

    async def _delete_many(self, collection: str, keys: Sequence[str]) -> int:
        collection_id, name = self._names.collection(collection)
        deleted = 0
        for chunk in chunks(sorted((digest(key.encode()), key.encode()) for key in keys), _CHUNK):
            ids = self._padded_ids([key_id for key_id, _ in chunk])
            encoded = self._padded_ids([key for _, key in chunk])
            count, _ = await self._query(self._sql.delete_many(len(ids)), (collection_id, *ids, name, *encoded))
            deleted += count
        return deleted

    async def _keys(self, collection: str, limit: int | None) -> list[str]:
        args = (*self._names.collection(collection), _NO_LIMIT if limit is None else limit)
        _, rows = await self._query(self._sql.keys, args)
        return [key for (raw,) in rows if (key := decoded(raw)) is not None]

    async def _collections(self, limit: int | None) -> list[str]:
        _, rows = await self._query(self._sql.collections, (_NO_LIMIT if limit is None else limit,))
        return [name for (raw,) in rows if (name := decoded(raw)) is not None]

    async def _destroy_collection(self, collection: str) -> bool:
        ids = self._names.collection(collection)
        live, _ = await self._query(self._sql.destroy_collection_live, ids)
        await self._query(self._sql.destroy_collection_rest, ids)  # the expired ones
        return live > 0

    async def _destroy(self) -> bool:
        live, _ = await self._query(self._sql.destroy_live)
        await self._query(self._sql.destroy_rest)  # the expired ones
        return live > 0

    async def _cull(self) -> None:
        await self._query(self._sql.cull)

    async def _swap(
        self, collection: str, key: str, expected: Stored | None, text: str | None, ttl: float | None
    ) -> bool:
        row = self._names.row(collection, key)
        if isinstance(expected, bytes):
            expected = expected.decode()
        if expected is None and text is None:  # delete what is absent: done while it stays absent
            _, rows = await self._query(self._sql.is_absent, row)
            return bool(rows[0][0])
        if expected is None:
            await self._sweep_when_due()
            count, _ = await self._query(self._sql.insert_if_absent, (*row, text, _micros(ttl)))
            return count > 0  # 1: inserted, 2: took over an expired row, 0: a live row stays
        if text is None:
            count, _ = await self._query(self._sql.delete_if, (*row, expected))
            return count > 0
        if text == expected and ttl is None:
            # MySQL counts changed rows, not matched ones, so writing the same text with no expiry over an
            # entry without one would count 0: that write changes nothing, and it is done while the entry is so
            _, rows = await self._query(self._sql.unchanged, (*row, expected))
            if rows[0][0]:
                return True
        count, _ = await self._query(self._sql.replace_if, (text, _micros(ttl), *row, expected))
        return count > 0

    async def _pop(self, collection: str, key: str) -> str | None:
        row = self._names.row(collection, key)
        if self._returning:
            _, rows = await self._query(self._sql.pop, row)
            return rows[0][0] if rows else None
        for _ in range(_POP_ATTEMPTS):  # MySQL: no RETURNING; read, then delete only what was read
            _, rows = await self._query(self._sql.get, row)
            if not rows:
                return None
            count, _ = await self._query(self._sql.delete_if, (*row, rows[0][0]))
            if count:
                text: str = rows[0][0]
                return text
        raise ConflictError(f"pop of key {key!r} lost {_POP_ATTEMPTS} races to concurrent writers; giving up")


async def _transaction(connection: Any, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
    """Run ``statements`` in one transaction; roll back (and re-raise) on any error."""
    await connection.begin()
    try:
        for sql, args in statements:
            await _execute(connection, sql, args)
        await connection.commit()
    except my_errors.MySQLError:
        with contextlib.suppress(Exception):
            await connection.rollback()
        raise


def _split_driver_options(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without its query, and the query's (driver) options."""
    base, _, query = url.partition("?")
    return base, dict(parse_qsl(query.partition("#")[0], keep_blank_values=True))
