"""PostgreSQL-specific tests: URLs, layout, long names, PgBouncer mode, privileges, timeouts.

The shared suites run over the table's ``postgresql`` row (tests/support/postgresql.py); these
tests pin what only this backend has. What every SQL-server backend must survive (first use
by several processes, a SIGKILLed writer, a private server stopped and crashed) is in
tests/test_sql_servers.py.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import asyncpg
import pytest

from kvstores import KVStoreError, StoreConnectionError, open_store
from kvstores.backends.postgresql import DEFAULT_TABLE, SCHEMA_VERSION, PostgreSQLStore
from tests.support.fixtures import rows
from tests.support.postgresql import PostgreSQLBackend, run_sql, table_name

pytestmark = [pytest.mark.anyio, pytest.mark.postgresql]

pg = pytest.mark.parametrize("backend", rows("postgresql"), indirect=True)
"""Run a test on the table's PostgreSQL row (the machine's server, the session's database)."""


def with_user(url: str, user: str) -> str:
    """``url`` logging in as ``user`` (trust auth: no password)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.hostname}:{parts.port}"))


async def exercise(store: PostgreSQLStore) -> None:
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
    assert await store.pop("new") == {"v": 2}
    assert await store.delete("k") is True
    assert await store.delete_many(["a", "a", "zz"], collection="c") == 1
    await store.cull()
    assert await store.destroy_collection("c") is True
    await store.put("k", {"v": 3})
    assert await store.destroy() is True
    assert await store.collections() == []


# -- URLs and options ----------------------------------------------------------------------


def test_url_store_options_are_taken_out_and_the_rest_goes_to_asyncpg() -> None:
    store = open_store(
        "postgresql://user:secret@db.example:6543/app?sslmode=verify-full&table=app.kv&timeout=2.5"
        "&application_name=x&max_connections=3&statement_cache_size=0&sweep_interval=9&default_collection=c&batching=off"
    )
    assert isinstance(store, PostgreSQLStore)
    assert store._url is not None
    parts = urlsplit(store._url)
    assert (parts.scheme, parts.netloc, parts.path) == ("postgresql", "user:secret@db.example:6543", "/app")
    assert parse_qsl(parts.query) == [("sslmode", "verify-full"), ("application_name", "x")]
    assert store.table == '"app"."kv"'
    assert store._timeout == 2.5
    assert store._pool_options["max_size"] == 3
    assert store._pool_options["statement_cache_size"] == 0
    assert store._sweep_interval == 9
    assert store.default_collection == "c"
    assert store.batching is False
    assert isinstance(open_store("postgres://localhost/db"), PostgreSQLStore)
    assert open_store("postgres://localhost/db?timeout=2", timeout=3)._timeout == 3  # type: ignore[attr-defined]
    assert PostgreSQLStore("postgresql://localhost/db").table == f'"{DEFAULT_TABLE}"'


@pytest.mark.parametrize(
    "table", ["", "1a", "a-b", 'a"b', "a b", "a.b.c", ".a", "a.", "x" * 56, "s" * 64 + ".t", "kv;DROP", "é"]
)
def test_table_must_be_an_identifier(table: str) -> None:
    with pytest.raises(ValueError, match="table must be"):
        PostgreSQLStore("postgresql://localhost/db", table=table)


def test_table_names_accepted_are_quoted() -> None:
    assert PostgreSQLStore("postgresql://h/db", table="Kv_1").table == '"Kv_1"'
    assert PostgreSQLStore("postgresql://h/db", table="s.t").table == '"s"."t"'
    assert PostgreSQLStore("postgresql://h/db", table="x" * 55).table == '"' + "x" * 55 + '"'


def test_url_or_pool_not_both() -> None:
    with pytest.raises(TypeError):
        PostgreSQLStore()
    with pytest.raises(TypeError):
        PostgreSQLStore(pool=object())  # type: ignore[arg-type]


@pg
async def test_url_options_reach_the_server(backend: PostgreSQLBackend, namespace: str) -> None:
    name = f"kvstores-{namespace}"
    url = f"{backend.database_url}?sslmode=disable&application_name={name}&table={table_name(namespace)}&timeout=3"
    async with open_store(url) as store:
        await store.put("k", {"v": 1})
        assert store.pool is not None
        sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1"
        assert await store.pool.fetchval(sql, name) >= 1
        await store.destroy()


@pg
async def test_user_pool_is_used_and_never_closed(backend: PostgreSQLBackend, namespace: str) -> None:
    pool = await asyncpg.create_pool(backend.database_url, min_size=1, max_size=2)
    try:
        with pytest.raises(TypeError):
            PostgreSQLStore(backend.database_url, pool=pool)
        with pytest.raises(TypeError):
            PostgreSQLStore(pool=pool, server_settings={})
        async with PostgreSQLStore(pool=pool, table=table_name(namespace)) as store:
            assert store.pool is pool
            await exercise(store)
        assert store.closed and not pool.is_closing()
        assert await pool.fetchval("SELECT 1") == 1
        unclosed = PostgreSQLStore(pool=pool, table=table_name(namespace))
        await unclosed.get("k")
        del unclosed  # no ResourceWarning: the pool is the user's (warnings are errors here)
    finally:
        await pool.close()


# -- layout ----------------------------------------------------------------------------------


@pg
async def test_layout_digests_full_names_text_values_and_database_clock(
    backend: PostgreSQLBackend, store: PostgreSQLStore
) -> None:
    await store.put("k\x00ey", {"b": 2, "a": 1, "big": 2**80}, collection="c", ttl=100)
    await store.put("plain", {"v": None})
    sql = (
        f"SELECT collection_id, key_id, collection, key, value, date_part('epoch', expires_at - now())"
        f" FROM {store.table} ORDER BY key"
    )
    (rows_,) = run_sql(backend.database_url, sql)
    by_key = {bytes(row[3]): row for row in rows_}
    assert set(by_key) == {b"k\x00ey", b"plain", b"schema_version"}
    collection_id, key_id, collection, _, value, remaining = by_key[b"k\x00ey"]
    assert (collection_id, key_id) == (hashlib.sha256(b"c").digest(), hashlib.sha256(b"k\x00ey").digest())
    assert collection == b"c"
    assert value == '{"b":2,"a":1,"big":1208925819614629174706176}'  # the codec's text, key order kept
    assert 99 < remaining <= 100  # now() of the database, not this process
    assert by_key[b"plain"][5] is None
    assert by_key[b"schema_version"][2:5] == (b"", b"schema_version", str(SCHEMA_VERSION))
    indexes = run_sql(
        backend.database_url, ("SELECT indexdef FROM pg_indexes WHERE tablename = $1", (store.table[1:-1],))
    )
    definitions = sorted(row[0] for row in indexes[0])
    assert any("(collection_id, key_id)" in d for d in definitions)
    assert any("(expires_at) WHERE (expires_at IS NOT NULL)" in d for d in definitions)


# -- PgBouncer: no named prepared statements -----------------------------------------------


@pg
@pytest.mark.parametrize(("cache", "named"), [(0, False), (100, True)])
async def test_statement_cache_size(backend: PostgreSQLBackend, namespace: str, cache: int, named: bool) -> None:
    url, options = backend.url(namespace)
    store = open_store(f"{url}?statement_cache_size={cache}&max_connections=1", **options)
    assert isinstance(store, PostgreSQLStore)
    try:
        for _ in range(2):  # the second run would reuse what the first prepared
            await exercise(store)
        assert store.pool is not None
        async with store.pool.acquire() as connection:  # the pool's one connection: the one used above
            prepared = await connection.fetchval("SELECT count(*) FROM pg_prepared_statements")
        assert (prepared > 0) is named
    finally:
        await store.aclose()


# -- schema: first use, privileges, versions -------------------------------------------------


@pg
async def test_least_privilege_role_that_owns_only_its_table(backend: PostgreSQLBackend) -> None:
    role = f"kvstores_lp_{uuid.uuid4().hex[:10]}"
    admin = backend.database_url
    database = urlsplit(admin).path.lstrip("/")
    run_sql(
        admin,
        f'CREATE ROLE "{role}" LOGIN',
        f'CREATE SCHEMA "{role}_app"',  # the admin's: the role may use it, not create in it
        f'GRANT USAGE ON SCHEMA "{role}_app" TO "{role}"',
        f'CREATE SCHEMA "{role}_own" AUTHORIZATION "{role}"',
    )
    try:
        (privileges,) = run_sql(
            admin,
            (
                "SELECT has_database_privilege($1, $2, 'CREATE'), has_schema_privilege($1, 'public', 'CREATE'),"
                " has_schema_privilege($1, $3, 'CREATE')",
                (role, database, f"{role}_app"),
            ),
        )
        assert tuple(privileges[0]) == (False, False, False)
        table = f"{role}_app.entries"
        async with PostgreSQLStore(admin, table=table) as creator:  # an admin creates it once...
            await creator.get("k")
        run_sql(admin, f'ALTER TABLE "{role}_app".entries OWNER TO "{role}"')  # ...and hands it over

        as_role = with_user(admin, role)
        async with PostgreSQLStore(as_role, table=table) as store:
            await exercise(store)
        async with PostgreSQLStore(as_role, table=f"{role}_own.entries") as store:  # its own schema: creates
            await exercise(store)
        for elsewhere in (f"{role}_app.other", "public.other", "other"):
            async with PostgreSQLStore(as_role, table=elsewhere) as store:
                with pytest.raises(KVStoreError, match="permission denied") as caught:
                    await store.get("k")
                assert isinstance(caught.value.__cause__, asyncpg.InsufficientPrivilegeError)
    finally:
        run_sql(admin, f'DROP SCHEMA "{role}_app" CASCADE', f'DROP SCHEMA "{role}_own" CASCADE', f'DROP ROLE "{role}"')


@pg
async def test_destroy_deletes_only_its_own_rows(
    backend: PostgreSQLBackend, namespace: str, store: PostgreSQLStore
) -> None:
    neighbour = f'"{table_name(namespace)[:40]}_neighbour"'
    run_sql(backend.database_url, f"CREATE TABLE {neighbour} (id int)", f"INSERT INTO {neighbour} VALUES (1), (2)")
    other = await backend.open(namespace + "_other")
    try:
        await store.put_many(["a", "b"], [{"v": 1}, {"v": 2}], collection="c")
        await other.put("a", {"v": "other"}, collection="c")
        assert await store.destroy() is True
        assert await store.destroy() is False
        assert run_sql(backend.database_url, f"SELECT count(*) FROM {neighbour}")[0][0][0] == 2
        assert await other.get("a", collection="c") == {"v": "other"}
        version = f"SELECT value FROM {store.table}"
        assert [row[0] for row in run_sql(backend.database_url, version)[0]] == [str(SCHEMA_VERSION)]
        await store.put("again", {"v": 3})  # the table is still there
        assert await store.get("again") == {"v": 3}
    finally:
        await other.destroy()
        await other.aclose()


@pg
async def test_other_schema_version_or_foreign_table_is_a_clear_error(
    backend: PostgreSQLBackend, namespace: str, store: PostgreSQLStore
) -> None:
    await store.put("k", {"v": 1})
    set_version = f"UPDATE {store.table} SET value = $1 WHERE collection = ''::bytea"
    run_sql(backend.database_url, (set_version, ("2",)))
    try:
        later = await backend.open(namespace)
        with pytest.raises(KVStoreError, match="schema version 2; this kvstores reads version 1"):
            await later.get("k")
        await later.aclose()
    finally:
        run_sql(backend.database_url, (set_version, (str(SCHEMA_VERSION),)))

    foreign = f"{table_name(namespace)[:40]}_foreign"
    run_sql(backend.database_url, f'CREATE TABLE "{foreign}" (id int)', f'INSERT INTO "{foreign}" VALUES (1)')
    async with PostgreSQLStore(backend.database_url, table=foreign) as alien:
        with pytest.raises(KVStoreError) as caught:
            await alien.destroy()
        assert isinstance(caught.value.__cause__, asyncpg.PostgresError)
    assert run_sql(backend.database_url, f'SELECT count(*) FROM "{foreign}"')[0][0][0] == 1


# -- timeouts on the machine's server ------------------------------------------------------


@pg
async def test_pool_exhausted_raises_connection_error_within_timeout(
    backend: PostgreSQLBackend, namespace: str
) -> None:
    store = await backend.open(namespace, max_connections=1, timeout=0.5)
    try:
        await store.put("k", {"v": 1})
        assert store.pool is not None
        async with store.pool.acquire():  # someone holds the only connection
            started = time.monotonic()
            with pytest.raises(StoreConnectionError) as caught:
                await store.get("k")
            assert time.monotonic() - started < 0.5 + 1.5
            assert isinstance(caught.value.__cause__, TimeoutError)
        assert await store.get("k") == {"v": 1}
    finally:
        await store.destroy()
        await store.aclose()


@pg
async def test_statement_blocked_by_a_lock_times_out(backend: PostgreSQLBackend, namespace: str) -> None:
    client_side = await backend.open(namespace, timeout=0.5)
    server_side = await backend.open(namespace, timeout=5, server_settings={"statement_timeout": "200"})
    locker = await asyncpg.connect(backend.database_url)
    try:
        await client_side.put("k", {"v": 1})
        assert await server_side.get("k") == {"v": 1}
        async with locker.transaction():
            await locker.execute(f"LOCK TABLE {client_side.table} IN ACCESS EXCLUSIVE MODE")
            for store, within, cause in [
                (client_side, 0.5, TimeoutError),  # the store's own deadline
                (server_side, 0.2, asyncpg.QueryCanceledError),  # the server's statement_timeout
            ]:
                started = time.monotonic()
                with pytest.raises(StoreConnectionError) as caught:
                    await store.put("k", {"v": 2})
                assert time.monotonic() - started < within + 1.5
                assert isinstance(caught.value.__cause__, cause)
        assert await client_side.get("k") == {"v": 1}
        assert await server_side.pop("k") == {"v": 1}
    finally:
        await locker.close()
        await client_side.destroy()
        await client_side.aclose()
        await server_side.aclose()
