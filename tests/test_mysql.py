"""MariaDB/MySQL-specific tests: URLs, layout, names, large values, pop without RETURNING, privileges, transactions.

The shared suites run over the table's ``mysql`` row (tests/support/mysql.py); these tests pin
what only this backend has. What every SQL-server backend must do and survive (first use by
several processes, a SIGKILLed writer, a private server stopped and crashed, the table's name,
the statement cache, schema versions, timeouts) is in tests/test_sql_servers.py.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import asyncmy
import pytest

import kvstores.backends.mysql as mysql_backend
from kvstores import MAX_VALUE_BYTES, KVStoreError, StoreConnectionError, open_store
from kvstores.backends.mysql import DEFAULT_TABLE, SCHEMA_VERSION, MySQLStore
from tests.support.fixtures import rows
from tests.support.mysql import MySQLBackend, run_sql, table_name
from tests.support.sql import exercise

pytestmark = [pytest.mark.anyio, pytest.mark.mysql]

my = pytest.mark.parametrize("backend", rows("mysql"), indirect=True)
"""Run a test on the table's MySQL row (the session's server and database)."""


def with_user(url: str, user: str, password: str) -> str:
    """``url`` logging in as ``user``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))


# -- URLs and options ----------------------------------------------------------------------


def test_url_store_options_are_taken_out_and_the_rest_goes_to_asyncmy() -> None:
    store = open_store(
        "mysql://us%40er:se%3Acret@db.example:3307/app?ssl=true&ssl_ca=/ca.pem&table=app.kv&timeout=2.5"
        "&max_connections=3&statement_cache_size=0&sweep_interval=9&default_collection=c&batching=off"
        "&program_name=x"
    )
    assert isinstance(store, MySQLStore)
    options = store._connect_options
    assert (options["host"], options["port"], options["user"], options["password"], options["database"]) == (
        "db.example",
        3307,
        "us@er",
        b"se:cret",  # UTF-8 bytes: asyncmy would send a str as Latin-1
        "app",
    )
    assert options["ssl"] == {"check_hostname": True, "ca": "/ca.pem"}
    assert options["program_name"] == "x"
    assert (options["maxsize"], options["stmt_cache_size"]) == (3, 0)
    assert store.table == "`app`.`kv`"
    assert store._timeout == 2.5
    assert store._sweep_interval == 9
    assert store.default_collection == "c"
    assert store.batching is False
    assert store.db_system == "mysql"
    assert store._server_address() == ("db.example", 3307)
    assert isinstance(open_store("mariadb://localhost/db"), MySQLStore)
    assert open_store("mariadb://localhost/db?timeout=2", timeout=3)._timeout == 3  # type: ignore[attr-defined]
    assert MySQLStore("mysql://localhost/db").table == f"`{DEFAULT_TABLE}`"
    with pytest.raises(ValueError, match="unknown MySQL URL option 'charset'"):
        open_store("mysql://localhost/db?charset=latin1")


# -- layout ----------------------------------------------------------------------------------


@my
async def test_layout_digests_full_names_text_values_and_server_clock(backend: MySQLBackend, store: MySQLStore) -> None:
    import hashlib

    await store.put("k\x00ey", {"b": 2, "a": 1, "big": 2**80, "e": "\U0001f600"}, collection="c", ttl=100)
    await store.put("plain", {"v": None})
    sql = (
        "SELECT collection_id, key_id, collection, `key`, value,"
        f" TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) FROM {store.table}"
    )
    (found,) = run_sql(backend.database_url, sql)
    by_key = {bytes(row[3]): row for row in found}
    assert set(by_key) == {b"k\x00ey", b"plain", b"schema_version"}
    collection_id, key_id, collection, _, value, remaining = by_key[b"k\x00ey"]
    assert (collection_id, key_id) == (hashlib.sha256(b"c").digest(), hashlib.sha256(b"k\x00ey").digest())
    assert collection == b"c"
    assert value == '{"b":2,"a":1,"big":1208925819614629174706176,"e":"\U0001f600"}'  # the codec's text
    assert 99_000_000 < remaining <= 100_000_000  # the server's clock, not this process's
    assert by_key[b"plain"][5] is None
    assert by_key[b"schema_version"][2:5] == (b"", b"schema_version", str(SCHEMA_VERSION))
    (indexes,) = run_sql(backend.database_url, f"SHOW INDEX FROM {store.table}")
    assert {(row[2], row[4]) for row in indexes} == {
        ("PRIMARY", "collection_id"),
        ("PRIMARY", "key_id"),
        ("expiry", "expires_at"),
    }


@my
async def test_server_time_zone_does_not_move_expiry(backend: MySQLBackend, namespace: str) -> None:
    east = await backend.open(namespace, init_command="SET time_zone = '+13:00'")
    west = await backend.open(namespace, init_command="SET time_zone = '-12:00'")
    try:
        await east.put("k", {"v": 1}, ttl=30)
        value, remaining = await west.ttl("k")
        assert value == {"v": 1} and remaining is not None and 29 < remaining <= 30
    finally:
        await east.destroy()
        await east.aclose()
        await west.aclose()


@my
async def test_case_and_normalization_stay_distinct(store: MySQLStore) -> None:
    names = ["a", "A", "caf\u00e9", "cafe\u0301", "a ", "a\x00"]
    await store.put_many(names, [{"i": i} for i in range(len(names))])
    assert await store.get_many(names) == [{"i": i} for i in range(len(names))]
    assert sorted(await store.keys()) == sorted(names)


@my
async def test_largest_value_round_trips(store: MySQLStore) -> None:
    value = {"v": '"\\' * ((MAX_VALUE_BYTES - 64) // 4)}  # every character escaped: the worst case on the wire
    await store.put("big", value)
    assert await store.get("big") == value
    await store.put_many(["big", "small"], [value, {"v": 1}])
    assert await store.pop("big") == value


@my
async def test_pop_without_returning_as_on_mysql(store: MySQLStore) -> None:
    await store.get("k")  # ready: the server was found to be MariaDB
    assert store._returning is True
    store._returning = False  # MySQL's path: read, then compare-and-delete
    await store.put("k", {"v": 1})
    assert await store.pop("k") == {"v": 1}
    assert await store.pop("k") is None
    await store.put("n", {"n": 0})

    async def popper() -> Any:
        return await store.pop("n")

    popped = await asyncio.gather(*(popper() for _ in range(10)))
    assert popped.count({"n": 0}) == 1 and popped.count(None) == 9


# -- schema: first use, privileges, versions -------------------------------------------------


@my
async def test_least_privilege_user_with_rights_on_its_table_only(backend: MySQLBackend, namespace: str) -> None:
    user, password = f"kv_lp_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    admin = backend.database_url
    database = urlsplit(admin).path.lstrip("/")
    table = f"{table_name(namespace)[:40]}_lp"
    async with MySQLStore(admin, table=table) as creator:  # an admin creates it once...
        await creator.get("k")
    run_sql(
        admin,
        f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'",  # ...and grants the four on it, nothing else
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{database}`.`{table}` TO '{user}'@'%'",
    )
    try:
        as_user = with_user(admin, user, password)
        async with MySQLStore(as_user, table=table) as store:
            await exercise(store)
            await store.put("k", {"v": 1}, ttl=0.01)
            await anyio.sleep(0.05)
            await store.cull()
            assert await store.get("k") is None
        for elsewhere in (f"{table}_other", "other"):
            async with MySQLStore(as_user, table=elsewhere) as store:
                with pytest.raises(KVStoreError, match="denied") as caught:
                    await store.get("k")
                assert isinstance(caught.value.__cause__, asyncmy.MySQLError)
    finally:
        run_sql(admin, f"DROP USER '{user}'@'%'", f"DROP TABLE `{table}`")


@my
async def test_a_password_beyond_latin_1_logs_in(backend: MySQLBackend, namespace: str) -> None:
    url = backend.url_with_password(namespace, "pässwörd-€-漢字-🔑")
    async with open_store(url) as store:
        await store.put("k", {"v": 1})
        assert await store.get("k") == {"v": 1}
        await store.destroy()


# -- atomicity and locking -------------------------------------------------------------------


@my
async def test_put_many_over_several_statements_is_all_or_nothing(
    store: MySQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mysql_backend, "_CHUNK", 10)  # 100 keys: ten statements in one transaction
    keys = [f"k{i}" for i in range(100)]
    await store.put_many(keys, [{"i": i} for i in range(100)])
    assert await store.get_many(keys) == [{"i": i} for i in range(100)]
    executed = 0
    real = mysql_backend._execute

    async def failing(connection: Any, sql: str, args: Any = ()) -> Any:
        nonlocal executed
        if sql.startswith("INSERT"):
            executed += 1
            if executed == 5:
                raise asyncmy.OperationalError(1205, "Lock wait timeout exceeded (injected)")
        return await real(connection, sql, args)

    monkeypatch.setattr(mysql_backend, "_execute", failing)
    with pytest.raises(StoreConnectionError):
        await store.put_many(keys, [{"i": -i} for i in range(100)])
    monkeypatch.setattr(mysql_backend, "_execute", real)
    assert await store.get_many(keys) == [{"i": i} for i in range(100)]  # the four statements that ran: undone
