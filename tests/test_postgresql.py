"""PostgreSQL-specific tests: URLs, a pool of the user's, layout, privileges.

The shared suites run over the table's ``postgresql`` row (tests/support/postgresql.py); these
tests pin what only this backend has. What every SQL-server backend must do and survive (first
use by several processes, a SIGKILLed writer, a private server stopped and crashed, the table's
name, the statement cache, schema versions, timeouts) is in tests/test_sql_servers.py.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import uuid
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import asyncpg
import pytest
from asyncpg import connect_utils

from kvstores import KVStoreError, open_store
from kvstores.backends.postgresql import DEFAULT_TABLE, SCHEMA_VERSION, PostgreSQLStore
from tests.support.fixtures import rows
from tests.support.postgresql import PostgreSQLBackend, run_sql, table_name
from tests.support.sql import exercise

pytestmark = [pytest.mark.anyio, pytest.mark.postgresql]

pg = pytest.mark.parametrize("backend", rows("postgresql"), indirect=True)
"""Run a test on the table's PostgreSQL row (the machine's server, the session's database)."""


def with_user(url: str, user: str) -> str:
    """``url`` logging in as ``user`` (trust auth: no password)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.hostname}:{parts.port}"))


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


@pg
async def test_a_connect_cut_during_its_tls_probe_logs_nothing(
    backend: PostgreSQLBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connect cancelled the moment its socket connects leaves no "Future exception was never retrieved".

    asyncpg's TLS probe (sslmode=prefer) then gets a lost connection that nobody awaits (asyncpg
    #1211, #1310; kvstores.backends._asyncpg_fix): seen as a store closed with calls in flight
    logging a traceback on a loaded machine. Here the cancel lands at exactly that moment, every time.
    """
    probes: list[Any] = []
    made = connect_utils.TLSUpgradeProto.__init__

    def cancel_once_made(self: Any, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)  # kvstores' fixed constructor
        probes.append(self)
        current = asyncio.current_task()
        assert current is not None
        current.cancel()  # the connecting task: its next await (the transport's) raises CancelledError

    monkeypatch.setattr(connect_utils.TLSUpgradeProto, "__init__", cancel_once_made)
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        with pytest.raises(asyncio.CancelledError):
            await asyncio.create_task(asyncpg.connect(backend.database_url))
        await asyncio.sleep(0)  # the closed transport's connection_lost() runs
        [probe] = probes
        assert probe.on_data.done() and not probe.on_data.cancelled()  # the lost connection is in the future
        probes.clear()
        del probe
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(handler)
    assert not reported, [context.get("message") for context in reported]


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
