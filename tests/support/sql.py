"""What the SQL-server rows (PostgreSQL, MariaDB/MySQL) share: :class:`SQLBackend`.

Each such row reaches a server, creates a database of its own for the session and drops it at
the end; each namespace is a table in that database (the store's ``table`` option). A dialect's
entry (tests/support/postgresql.py, tests/support/mysql.py) gives its driver calls
(:meth:`SQLBackend.connect`, :meth:`SQLBackend.fetch`, :meth:`SQLBackend.close`), its quoting
and placeholders, and what its server reports (prepared statements, calls waiting on locks).
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import re
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

from tests.support import Backend, run_in_thread

Statement = str | tuple[str, Sequence[Any]]
"""SQL, or (SQL, arguments)."""


def with_database(url: str, database: str) -> str:
    """``url`` naming ``database`` instead of its own."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


async def exercise(store: Any) -> None:
    """Every operation once, checking the results (a store on an empty table)."""
    await store.put("k", {"v": 1})
    await store.put_many(["a", "b"], [{"v": "a"}, {"v": "b"}], collection="c", ttl=60)
    assert await store.get("k") == {"v": 1}
    assert await store.get_many(["a", "x", "b"], collection="c") == [{"v": "a"}, None, {"v": "b"}]
    (value, remaining), *_ = await store.ttl_many(["a"], collection="c")
    assert value == {"v": "a"} and remaining is not None and 55 < remaining <= 60
    assert await store.ttl("k") == ({"v": 1}, None)
    assert sorted(await store.keys("c")) == ["a", "b"]
    assert await store.collections() == ["c", "default"]
    assert await store.put_if_absent("k", {"v": 2}) is False
    assert await store.put_if_absent("new", {"v": 2}) is True
    assert await store.update("k", lambda old: {"v": old["v"] + 1} if old else None) == {"v": 2}
    assert await store.update("k", lambda old: old) == {"v": 2}  # the same text: no row changes, still a success
    assert await store.pop("new") == {"v": 2}
    assert await store.delete("k") is True
    assert await store.delete_many(["a", "a", "zz"], collection="c") == 1
    await store.cull()
    assert await store.destroy_collection("c") is True
    await store.put("k", {"v": 3})
    assert await store.destroy() is True
    assert await store.collections() == []


class SQLBackend(Backend, abc.ABC):
    """A store class from a URL, on a database of the session's own; one table per namespace."""

    server = True
    proxied = True
    sql = True
    store_class: ClassVar[type[Any]]
    """The store class of the row."""
    quote: ClassVar[str]
    """The dialect's identifier quote."""
    sql_error: ClassVar[type[Exception]]
    """The driver's base class of the errors the server reports."""
    create_options: ClassVar[str] = ""
    """What follows ``CREATE DATABASE <name>``."""
    drop_options: ClassVar[str] = ""
    """What follows ``DROP DATABASE IF EXISTS <name>``."""
    server_url: str
    database_url: str

    # -- the dialect --------------------------------------------------------------------

    @classmethod
    def mark(cls, number: int) -> str:
        """The placeholder of parameter ``number`` (from 1)."""
        return cls.store_class.statements.placeholder.format(number)

    @classmethod
    @abc.abstractmethod
    async def connect(cls, url: str) -> Any:
        """A new connection to ``url``, in autocommit."""

    @staticmethod
    @abc.abstractmethod
    async def fetch(connection: Any, sql: str, arguments: Sequence[Any]) -> list[Any]:
        """The rows of one statement ([] for none)."""

    @staticmethod
    @abc.abstractmethod
    async def close(connection: Any) -> None:
        """Close a connection from :meth:`connect`."""

    @abc.abstractmethod
    async def prepared(self, store: Any) -> int:
        """How many prepared statements the server holds for ``store`` (whose pool has one connection)."""

    @abc.abstractmethod
    async def waiting_on_locks(self) -> int:
        """How many statements on the row's database wait for a lock now."""

    @abc.abstractmethod
    def lock_timeout(self, seconds: float) -> dict[str, Any]:
        """Store options under which the server gives up a statement after waiting ``seconds`` for a lock."""

    # -- shared -------------------------------------------------------------------------

    @classmethod
    def run_sql(cls, url: str, *statements: Statement) -> list[Any]:
        """Run each statement on one new connection; return each one's rows.

        Runs on a thread of its own with its own event loop, so that sync code (fixtures, other
        threads) and async tests alike can call it.
        """

        async def work() -> list[Any]:
            results: list[Any] = []
            connection = await cls.connect(url)
            try:
                for statement in statements:
                    sql, arguments = (statement, ()) if isinstance(statement, str) else statement
                    results.append(await cls.fetch(connection, sql, arguments))
            finally:
                await cls.close(connection)
            return results

        return run_in_thread(work, f"SQL on {urlsplit(url).netloc}")

    @classmethod
    def table_name(cls, namespace: str) -> str:
        """The table of ``namespace``: the name itself when it is an identifier, else a digest of it."""
        if re.fullmatch(rf"[a-z_][a-z0-9_]{{0,{cls.store_class._max_name - 1}}}", namespace):
            return namespace
        return "ns_" + hashlib.sha256(namespace.encode()).hexdigest()[:40]

    def quoted(self, name: str) -> str:
        """``name`` quoted as an identifier."""
        return f"{self.quote}{name}{self.quote}"

    def create_database(self) -> None:
        """Create a database with a new name on the server; the row's ``database_url`` names it."""
        name = f"kvstores_tests_{uuid.uuid4().hex[:12]}"
        self.run_sql(self.server_url, f"CREATE DATABASE {self.quoted(name)}{self.create_options}")
        self.database_url = with_database(self.server_url, name)

    def url(self, namespace: str) -> tuple[str, dict[str, Any]]:
        return self.database_url, {"table": self.table_name(namespace)}

    def rows_of(self, table: str, collection: str) -> dict[str, str]:
        key = self.store_class.statements.key
        sql = f"SELECT {key}, value FROM {self.quoted(table)} WHERE collection = {self.mark(1)}"
        try:
            (found,) = self.run_sql(self.database_url, (sql, (collection.encode(),)))
        except self.sql_error:  # no table yet
            return {}
        return {bytes(raw).decode(): value for raw, value in found}

    def corrupt(self, store: Any, key: str, raw: str | bytes | int) -> None:
        if not isinstance(raw, str):
            import pytest  # here: the child processes of workers.py import this module and must start fast

            pytest.skip(f"{self.store_class.__name__}'s value column is text: bytes and numbers cannot be put there")
        mark, column, row = self.mark, self.store_class.statements.key, (b"default", key.encode())
        _, found = self.run_sql(
            self.database_url,
            (
                f"UPDATE {store.table} SET value = {mark(1)} WHERE collection = {mark(2)} AND {column} = {mark(3)}",
                (raw, *row),
            ),
            (f"SELECT value FROM {store.table} WHERE collection = {mark(1)} AND {column} = {mark(2)}", row),
        )
        assert [row[0] for row in found] == [raw]

    def drop_database(self) -> None:
        """Drop the row's database (disconnecting its clients where the server can)."""
        self.run_sql(
            self.server_url,
            f"DROP DATABASE IF EXISTS {self.quoted(urlsplit(self.database_url).path.lstrip('/'))}{self.drop_options}",
        )

    def lock_row(self, table: str, key: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold the lock of the row of ``key`` (any collection) of the quoted ``table`` for the block."""
        return self._held(f"SELECT value FROM {table} WHERE {self.store_class.statements.key} = '{key}' FOR UPDATE")

    @contextlib.asynccontextmanager
    async def _held(self, sql: str) -> AsyncIterator[None]:
        """A connection of its own that runs ``sql`` in a transaction, open for the block."""
        connection = await self.connect(self.database_url)
        try:
            await self.fetch(connection, "BEGIN", ())
            await self.fetch(connection, sql, ())
            yield
            await self.fetch(connection, "ROLLBACK", ())
        finally:
            await self.close(connection)
