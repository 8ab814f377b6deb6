"""MySQLStore: a persistent store in one MariaDB or MySQL table, on asyncmy's connection pool.

The table, as kvstores.backends._sql describes it (the shared layout, expiry, options and errors)::

    CREATE TABLE `kvstores_entries` (
        collection_id BINARY(32) NOT NULL,      -- sha256(UTF-8 collection name)
        key_id        BINARY(32) NOT NULL,      -- sha256(UTF-8 key)
        collection    VARBINARY(4096) NOT NULL, -- the UTF-8 collection name, in full
        `key`         VARBINARY(4096) NOT NULL, -- the UTF-8 key, in full
        value         LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        expires_at    DATETIME(6) NULL,         -- UTC, from the server's clock; NULL: never expires
        PRIMARY KEY (collection_id, key_id),
        KEY expiry (expires_at)) ENGINE=InnoDB;

Names are ``VARBINARY``: NUL, case and NFC vs NFD stay distinct, and no collation pads or folds
them; values keep 4-byte characters. Expiry is ``UTC_TIMESTAMP(6) + INTERVAL ttl MICROSECOND``
(in UTC, so no session or server time zone changes it). get_many/ttl_many/delete_many take
1,000 keys a statement (``key_id IN (...)``); put and put_many are ``INSERT ... ON DUPLICATE KEY
UPDATE`` (put_many: one multi-row statement per 1,000 rows or 4 MiB, all of them in one
transaction when there are several, so all or nothing); pop is ``DELETE ... RETURNING value``
on MariaDB (on MySQL, which has no RETURNING, a read then the compare-and-delete, retried on a
lost race). The table is created under a named lock (``GET_LOCK``).

Driver: asyncmy (the ``mysql`` extra). It keeps aiomysql's API and pool, but its protocol, pool
and row parsing are compiled with Cython (about twice aiomysql's speed on point queries), it
ships Python 3.11 wheels and type stubs, is released regularly, and offers a cache of
server-side prepared statements (binary protocol: no escaping of parameters, fixed statement
text per call shape). On a cancelled read it closes the connection rather than handing back a
desynchronised one; neither driver cancels the statement on the server, so the store does: a
statement whose call timed out is killed (``KILL``, on a connection of its own: a user may kill
its own connections without any privilege) so that it holds no lock afterwards.

URLs: ``mysql://user:password@host:3306/database`` (or ``mariadb://``), percent-encoded
credentials; ``?unix_socket=/run/mysqld/mysqld.sock``, ``?ssl=true`` (TLS with the system's
CAs), ``?ssl_ca=``, ``?ssl_cert=``, ``?ssl_key=`` (files) and ``?program_name=`` go to the
driver; any other query option that is not the store's is an error. ``table``: ``name`` or
``database.name``, at most 64 characters each. ``statement_cache_size``: default 128 prepared
statements per connection; 0 sends every statement as text (e.g. behind a proxy that cannot
route prepared statements). Timeouts include ``max_statement_time`` and
``innodb_lock_wait_timeout``. Other keyword options go to ``asyncmy.connect`` (e.g. ``ssl=``
an SSLContext, ``init_command=``).

Server requirements: InnoDB; ``max_allowed_packet`` of at least 32 MiB (64 MiB advised) so that
a value of the largest size kvstores accepts (just under 16 MiB of JSON) travels in one
statement and one result row: MariaDB's default (16 MiB) is too small for those values only.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qsl, unquote, urlsplit

from kvstores._codec import ttl_milliseconds
from kvstores._optional import missing_extra
from kvstores._urls import flag
from kvstores.backends import _sql
from kvstores.backends._sql import DEFAULT_TABLE, SCHEMA_VERSION, SQLServerStore, Statements, T, digest
from kvstores.base import Stored, by_collection, chunks
from kvstores.errors import ConflictError, StoreConnectionError
from kvstores.loop import deadline

if TYPE_CHECKING:
    from kvstores._signal_host import Sink, Transport

try:
    import asyncmy
    from asyncmy import errors as my_errors
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("asyncmy", "mysql") from exc


__all__ = ["DEFAULT_TABLE", "SCHEMA_VERSION", "MySQLStore"]

_DRIVER_QUERY_OPTIONS = ("unix_socket", "ssl", "ssl_ca", "ssl_cert", "ssl_key", "program_name")
_CHUNK: Final = 1_000  # keys or rows per bulk statement
_CHUNK_BYTES: Final = 4 * 1024 * 1024  # encoded values per put_many statement (a single value may exceed it)
_POP_ATTEMPTS: Final = 100  # MySQL's read-then-compare-and-delete pop, racing other writers
_LOCK_WAIT: Final = 30  # seconds GET_LOCK waits for another process creating the table
_POOL_ONLY: Final = ("minsize", "maxsize", "pool_recycle", "stmt_cache_size")  # not for a connection of its own

_DEADLOCK: Final = 1213  # ER_LOCK_DEADLOCK: the server rolled the statement or transaction back
_NO_SUCH_TABLE: Final = 1146
_CLIENT_ERRORS = frozenset(range(2000, 3000))  # CR_*: raised by the driver (connection refused, lost, gone away...)
_LOST = frozenset({1053, 1927, 4031})  # ER_SERVER_SHUTDOWN, ER_CONNECTION_KILLED (MariaDB), MySQL 8's inactivity cut
_BROKEN_CODES = _CLIENT_ERRORS | _LOST
_UNREACHABLE_CODES = _BROKEN_CODES | {
    1040,  # ER_CON_COUNT_ERROR: too many connections
    1205,  # ER_LOCK_WAIT_TIMEOUT (innodb_lock_wait_timeout)
    1317,  # ER_QUERY_INTERRUPTED: KILL QUERY
    1969,  # ER_STATEMENT_TIMEOUT (MariaDB max_statement_time)
    3024,  # ER_QUERY_TIMEOUT (MySQL max_execution_time)
}


def _code(exc: BaseException) -> int | None:
    """The MySQL error number of an asyncmy error, if it carries one."""
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _bucket(count: int) -> int:
    """``count`` rounded up to a power of two (at most _CHUNK): bulk statements come in few shapes,
    so each is prepared once per connection."""
    return min(_CHUNK, 1 << (count - 1).bit_length())


@functools.cache
def _marks(count: int) -> str:
    """``count`` placeholders, comma-separated."""
    return ", ".join(["%s"] * count)


def _connect_options(url: str) -> dict[str, Any]:
    """asyncmy.connect's keyword arguments for ``mysql://user:password@host:port/database?...``."""
    base, _, query = url.partition("?")
    parts = urlsplit(base)
    options: dict[str, Any] = {
        "host": parts.hostname or "localhost",
        "port": parts.port or 3306,
        "user": unquote(parts.username) if parts.username else None,
        # UTF-8 bytes, as the server hashed the password sent over a utf8mb4 connection (asyncmy
        # would encode a str as Latin-1: a password beyond it could not log in, and the error
        # carried the whole password)
        "password": unquote(parts.password or "").encode("utf-8"),
        "database": unquote(parts.path.lstrip("/")) or None,
    }
    ssl: dict[str, Any] = {}
    for name, value in dict(parse_qsl(query.partition("#")[0], keep_blank_values=True)).items():
        if name not in _DRIVER_QUERY_OPTIONS:
            known = ", ".join([*MySQLStore.url_options, "batching", *_DRIVER_QUERY_OPTIONS])
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


class _Statements(Statements):
    """The SQL of one table, built once per store (``%s`` placeholders)."""

    key, now, placeholder = "`key`", "UTC_TIMESTAMP(6)", "%s"
    remaining = "TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) * 1e-6"
    expiry_of = "UTC_TIMESTAMP(6) + INTERVAL {} MICROSECOND"

    def __init__(self, table: str) -> None:
        super().__init__(table)
        self.values = f"(%s, %s, %s, %s, %s, {self.expiry('%s')})"
        same = "collection = VALUES(collection) AND `key` = VALUES(`key`)"  # never a digest collision
        # expires_at is assigned last: MySQL evaluates the assignments in order, on the updated row
        self.upsert = (
            f" ON DUPLICATE KEY UPDATE value = IF({same}, VALUES(value), value),"
            f" expires_at = IF({same}, VALUES(expires_at), expires_at)"
        )
        self.insert = f"INSERT INTO {table} {self.columns} VALUES "
        self.create = (
            f"CREATE TABLE IF NOT EXISTS {table} (collection_id BINARY(32) NOT NULL, key_id BINARY(32) NOT NULL,"
            " collection VARBINARY(4096) NOT NULL, `key` VARBINARY(4096) NOT NULL,"
            " value LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, expires_at DATETIME(6) NULL,"
            " PRIMARY KEY (collection_id, key_id), KEY expiry (expires_at))"
            " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        )
        self.probe = f"SELECT 1 FROM {table} LIMIT 0"
        self.add_version = (
            f"{self.insert}(%s, %s, %s, %s, %s, NULL) ON DUPLICATE KEY UPDATE collection_id = collection_id"
        )
        self.put = f"{self.insert}{self.values}{self.upsert}"
        self.sweep = f"DELETE FROM {table} WHERE expires_at <= {self.now} ORDER BY expires_at LIMIT {self.sweep_batch}"
        expired = f"{same} AND expires_at <= {self.now}"
        self.insert_if_absent = (
            f"{self.insert}{self.values} ON DUPLICATE KEY UPDATE value = IF({expired}, VALUES(value), value),"
            f" expires_at = IF({expired}, VALUES(expires_at), expires_at)"
        )
        self.unchanged = (
            f"SELECT EXISTS (SELECT 1 FROM {table} WHERE {self.row(1)} AND value = %s AND expires_at IS NULL)"
        )

    def select_many(self, columns: str, count: int) -> str:
        """SELECT ``columns`` of the live rows of one collection whose key_id is one of ``count``."""
        return (
            f"SELECT `key`, {columns} FROM {self.table} WHERE collection_id = %s"
            f" AND key_id IN ({_marks(count)}) AND collection = %s AND {self.live}"
        )

    def put_many(self, count: int) -> str:
        """Upsert ``count`` rows."""
        return f"{self.insert}{', '.join([self.values] * count)}{self.upsert}"

    def delete_many(self, count: int) -> str:
        """Delete the live rows of ``count`` keys of one collection."""
        return (
            f"DELETE FROM {self.table} WHERE collection_id = %s AND key_id IN ({_marks(count)})"
            f" AND collection = %s AND `key` IN ({_marks(count)}) AND {self.live}"
        )


async def _execute(connection: Any, sql: str, args: Sequence[Any] = ()) -> tuple[int, Sequence[Any]]:
    """Run one statement; its affected-row count and its rows."""
    async with connection.cursor() as cursor:
        count: int = await cursor.execute(sql, args)
        rows: Sequence[Any] = await cursor.fetchall() if cursor.description else ()
        return count, rows


class MySQLStore(SQLServerStore):
    """A persistent store in one MariaDB/MySQL table, shared by every process that opens it."""

    db_system = "mysql"
    label = "MySQL"
    statement_cache_default = 128
    pool: asyncmy.Pool | None = None
    _quote = "`"
    _scope = "database"
    _max_part = 64
    _max_name = 64
    _driver_errors = (my_errors.MySQLError, ValueError, TypeError)  # ValueError, TypeError: the driver's checks
    statements = _Statements
    _sql: _Statements

    def _configure(self, url: str | None, max_connections: int, statement_cache_size: int, options: Any) -> None:
        if url is None:
            raise TypeError("MySQLStore needs a URL")
        if statement_cache_size < 0:
            raise ValueError(f"statement_cache_size must be >= 0, got {statement_cache_size}")
        self._pads = statement_cache_size > 0
        self._connect_options: dict[str, Any] = {
            **_connect_options(url),
            "minsize": 0,  # connect on demand: a store made while the server is down still opens
            "maxsize": max_connections,
            "pool_recycle": 3600,
            "connect_timeout": max(1, round(self._timeout)),
            "charset": "utf8mb4",
            "autocommit": True,
            "binary_prefix": True,  # digests are not UTF-8: send bytes as _binary literals
            "sql_mode": "'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'",  # and never NO_BACKSLASH_ESCAPES
            "stmt_cache_size": statement_cache_size,
            **options,
        }
        self._returning = True  # MariaDB's DELETE ... RETURNING (decided on first use)
        lock = digest(f"{self._connect_options.get('database')}.{self.table}".encode()).hex()
        self._lock_name = f"kvstores:{lock[:48]}"

    # -- the driver ------------------------------------------------------------------

    async def _create_pool(self) -> asyncmy.Pool:
        return await asyncmy.create_pool(**self._connect_options)

    async def _close_pool(self, pool: asyncmy.Pool) -> None:
        pool.close()
        await pool.wait_closed()

    async def _check_schema(self, connection: Any) -> None:
        self._returning = "mariadb" in connection.get_server_info().lower()
        await super()._check_schema(connection)

    async def _read_version(self, connection: Any, row: Sequence[bytes]) -> str | None:
        try:
            _, rows = await _execute(connection, self._sql.version, row)
        except my_errors.ProgrammingError as exc:
            if _code(exc) != _NO_SUCH_TABLE:
                raise
            return None
        return rows[0][0] if rows else None

    async def _create_table(self, connection: Any, version: Sequence[Any]) -> None:
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
            await _execute(connection, self._sql.add_version, version)
        finally:
            await _execute(connection, "DO RELEASE_LOCK(%s)", (self._lock_name,))

    async def _release(self, pool: asyncmy.Pool, connection: Any) -> None:
        pool.release(connection)

    def _abandon(self, pool: asyncmy.Pool, connection: Any) -> Callable[[], None] | None:
        # drop the connection: it is mid-protocol; on our deadline the statement may still run
        # (and hold locks) on the server, so it is killed, from a connection of its own
        thread = connection.thread_id()
        connection.close()
        pool.release(connection)
        return lambda: self._in_background(self._kill(thread))

    def _drop(self, connection: Any) -> None:
        connection.close()

    @staticmethod
    def _is_deadlock(exc: Exception) -> bool:
        return isinstance(exc, my_errors.OperationalError) and _code(exc) == _DEADLOCK

    @staticmethod
    def _is_broken(exc: BaseException) -> bool:
        return (
            not isinstance(exc, my_errors.MySQLError)
            or isinstance(exc, my_errors.InterfaceError)
            or (_code(exc) in _BROKEN_CODES)
        )

    @staticmethod
    def _is_unreachable(exc: Exception) -> bool:
        # OSError: refused, reset, TLS; TimeoutError (our deadline)
        return isinstance(exc, (OSError, my_errors.InterfaceError)) or (
            isinstance(exc, my_errors.MySQLError) and _code(exc) in _UNREACHABLE_CODES
        )

    @staticmethod
    def _expiry(ttl: float | None) -> int | None:
        """The TTL in microseconds, rounded up to whole milliseconds."""
        return None if ttl is None else ttl_milliseconds(ttl) * 1000

    async def fetch(self, sql: str, *args: Any) -> Sequence[Sequence[Any]]:
        return (await self._run(lambda connection: _execute(connection, sql, args)))[1]

    async def _count(self, sql: str, *args: Any) -> int:
        return (await self._run(lambda connection: _execute(connection, sql, args)))[0]

    async def _kill(self, thread: int) -> None:
        options = {name: value for name, value in self._connect_options.items() if name not in _POOL_ONLY}
        async with deadline(self._timeout):
            connection = await asyncmy.connect(**options, stmt_cache_size=0)
            try:
                await _execute(connection, "KILL %s", (thread,))
            finally:
                connection.close()

    def _server_address(self) -> tuple[str, int] | None:
        return (self._connect_options["host"], self._connect_options["port"])

    def _signal_transport(self, sink: Sink) -> Transport[Any]:
        from kvstores.backends._mysql_signals import MySQLTransport  # only a store that signals loads it

        return MySQLTransport(self, sink)

    def tables(self) -> list[str]:
        """The quoted tables this store creates: its own and the one its signals poll."""
        from kvstores.backends._mysql_signals import signal_table

        return [*super().tables(), signal_table(self.table)]  # its signals poll a table of their own

    def _padded(self, items: list[T]) -> list[T]:
        """``items`` padded with copies of its last one to a statement shape that is prepared already."""
        return items + items[-1:] * (_bucket(len(items)) - len(items)) if self._pads else items

    # -- primitives ------------------------------------------------------------------

    async def _select_rows(
        self, columns: str, collection: tuple[bytes, bytes], key_ids: list[bytes]
    ) -> Sequence[Sequence[Any]]:
        collection_id, name = collection
        rows: list[Sequence[Any]] = []
        for chunk in chunks(key_ids, _CHUNK):
            ids = self._padded(list(chunk))
            rows += await self.fetch(self._sql.select_many(columns, len(ids)), collection_id, *ids, name)
        return rows

    async def _get_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[str | None]:
        # one SELECT per collection (each on the primary key), joined by UNION ALL: one round trip
        parts: list[str] = []
        args: list[Any] = []
        for collection, keys in by_collection(pairs).items():
            collection_id, name = _sql.collection_ids(collection)
            ids = self._padded([digest(key.encode()) for key in keys])
            parts.append(self._sql.select_many("collection, value", len(ids)))
            args += (collection_id, *ids, name)
        rows = await self.fetch(" UNION ALL ".join(parts), *args)
        found = {(name, key): text for key, name, text in rows}
        return [found.get((collection.encode(), key.encode())) for collection, key in pairs]

    async def _upsert(self, rows: list[tuple[Any, ...]]) -> None:
        statements: list[tuple[str, list[Any]]] = []
        batch: list[tuple[Any, ...]] = []
        size = 0
        for row in rows:
            if batch and (len(batch) == _CHUNK or size + len(row[4]) > _CHUNK_BYTES):
                statements.append(self._upsert_statement(batch))
                batch, size = [], 0
            batch.append(row)
            size += len(row[4])
        statements.append(self._upsert_statement(batch))
        if len(statements) == 1:
            await self._count(statements[0][0], *statements[0][1])
        else:
            await self._run(lambda connection: _transaction(connection, statements))

    def _upsert_statement(self, batch: list[tuple[Any, ...]]) -> tuple[str, list[Any]]:
        """One multi-row upsert of ``batch``, padded to a prepared shape."""
        batch = self._padded(batch)
        return self._sql.put_many(len(batch)), [value for row in batch for value in row]

    async def _delete_rows(self, collection: tuple[bytes, bytes], pairs: list[tuple[bytes, bytes]]) -> int:
        collection_id, name = collection
        deleted = 0
        for chunk in chunks(pairs, _CHUNK):
            ids = self._padded([key_id for key_id, _ in chunk])
            encoded = self._padded([key for _, key in chunk])
            deleted += await self._count(self._sql.delete_many(len(ids)), collection_id, *ids, name, *encoded)
        return deleted

    async def _swap(
        self, collection: str, key: str, expected: Stored | None, text: str | None, ttl: float | None
    ) -> bool:
        # MySQL counts changed rows, not matched ones, so writing the same text with no expiry over an
        # entry without one would count 0: that write changes nothing, and it is done while the entry is so
        unchanged = text is not None and ttl is None and (expected == text or expected == text.encode())
        if unchanged and await self._value(self._sql.unchanged, *_sql.row_ids(collection, key), text):
            return True
        return await super()._swap(collection, key, expected, text, ttl)

    async def _pop(self, collection: str, key: str) -> str | None:
        if self._returning:
            return await super()._pop(collection, key)
        row = _sql.row_ids(collection, key)
        for _ in range(_POP_ATTEMPTS):  # MySQL: no RETURNING; read, then delete only what was read
            text: str | None = await self._value(self._sql.get, *row)
            if text is None or await self._count(self._sql.delete_if, *row, text):
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
