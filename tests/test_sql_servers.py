"""What every SQL-server backend (PostgreSQL, MariaDB/MySQL) must survive: rows ``sql`` of the table.

Several processes creating the schema at once; overlapping bulk writes from several pools; the
longest names (digests in the index) distinct and whole; expired rows hidden at once, reclaimed
by the sweep and by cull, and taken over by a write; a writer killed with SIGKILL between and
inside its transactions; nothing listening; the table's name, the statement cache, destroy()
and a foreign or newer table; a full pool and a statement blocked by a lock; and, on a
private server of the test's own (``Backend.private_server``), the server stopped under load,
crashed, and down when the store is made, with the same store object working once it is back.
What only one backend has stays in its own module (test_postgresql.py, test_mysql.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import select
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import pytest

from kvstores import KVStoreError, StoreConnectionError, open_store
from kvstores.backends._sql import SCHEMA_VERSION
from tests.support import Backend, PrivateServer, Unavailable, entry_class, free_port, marker, run_processes
from tests.support.fixtures import assert_connection_errors, rows_with, skip_or_fail
from tests.support.sql import SQLBackend, exercise
from tests.support.workers import first_use, newest_whole_batch

pytestmark = pytest.mark.anyio

ROWS = rows_with("sql")
sql_rows = pytest.mark.parametrize("backend", ROWS, indirect=True)
"""Run a test on each SQL row's own server and database (the session's)."""

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 1.0
"""The ``timeout`` option of the stores on a private server."""
KILLS = 8


@sql_rows
def test_concurrent_first_use_by_several_processes_creates_the_schema_once(backend: Backend, namespace: str) -> None:
    workers = 5
    for round_ in range(3):
        table = f"{namespace}_{round_}"
        url, _ = backend.url(namespace)
        outcomes = run_processes(first_use, [(url, table, worker) for worker in range(workers)], 120)
        assert outcomes == dict.fromkeys(range(workers)), outcomes
        assert len(backend.rows_of(table, "")) == 1, "the schema-version row"
        assert len(backend.rows_of(table, "default")) == workers


@sql_rows
async def test_concurrent_overlapping_bulk_writes_never_deadlock(
    backend: Backend, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bulk writes lock their rows in one order (sorted by digest), so overlapping put_many and
    delete_many calls from several pools queue instead of deadlocking (seen under the soak).

    The stores would run a deadlock victim's statement again, hiding it: every error they see is
    watched, and the server must not have picked a single victim."""
    stores = [await backend.open(namespace, batching=False) for _ in range(3)]
    keys = [f"k{i}" for i in range(40)]
    kind = type(stores[0])
    is_deadlock = kind._is_deadlock
    victims: list[Exception] = []

    def watched(exc: Exception) -> bool:
        if is_deadlock(exc):
            victims.append(exc)
            return True
        return False

    monkeypatch.setattr(kind, "_is_deadlock", staticmethod(watched))
    try:

        async def writer(store: Any, seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(60):
                chosen = rng.sample(keys, 20)
                await store.put_many(chosen, [{"seed": seed}] * len(chosen))
                await store.delete_many(rng.sample(keys, 5))

        await asyncio.gather(*(writer(store, seed) for seed, store in enumerate(stores * 2)))
        assert victims == []
        for value in await stores[0].get_many(keys):  # whole writes only
            assert value is None or set(value) == {"seed"}
    finally:
        await stores[0].destroy()
        for store in stores:
            await store.aclose()


@sql_rows
async def test_longest_multibyte_names_round_trip_and_stay_distinct(store: Any) -> None:
    """The longest names, 4 KiB of UTF-8 each, beyond any index's key length: the tables key on digests."""
    collection, key = "\U0001f600" * 1024, "\U0001f601" * 1024
    near_collection, near_key = collection[:-1] + "\U0001f602", key[:-1] + "\U0001f603"
    pairs = [(collection, key), (collection, near_key), (near_collection, key), (near_collection, near_key)]
    for index, (c, k) in enumerate(pairs):
        await store.put(k, {"i": index}, collection=c)
    for index, (c, k) in enumerate(pairs):
        assert await store.get(k, collection=c) == {"i": index}
        assert await store.ttl(k, collection=c) == ({"i": index}, None)
    assert await store.get_many([key, near_key], collection=collection) == [{"i": 0}, {"i": 1}]
    assert await store.ttl_many([near_key], collection=near_collection) == [({"i": 3}, None)]
    assert sorted(await store.keys(collection)) == sorted([key, near_key])
    assert sorted(await store.collections()) == sorted([collection, near_collection])
    await store.put_many([key, near_key], [{"m": 0}, {"m": 1}], collection=near_collection, ttl=60)
    assert await store.get_many([near_key, key], collection=near_collection) == [{"m": 1}, {"m": 0}]
    assert await store.put_if_absent(key, {"x": 1}, collection=collection) is False
    assert await store.update(key, lambda old: {"i": old["i"] + 10} if old else None, collection=collection) == {
        "i": 10
    }
    assert await store.pop(near_key, collection=collection) == {"i": 1}
    assert await store.get(key, collection=collection) == {"i": 10}
    assert await store.delete_many([key, near_key, key], collection=near_collection) == 2
    assert await store.collections() == [collection]
    assert await store.destroy_collection(collection) is True
    assert await store.collections() == []


@sql_rows
async def test_expired_rows_are_reclaimed_by_the_sweep_and_by_cull(
    backend: Backend, namespace: str, store: Any
) -> None:
    _, options = backend.url(namespace)

    def rows() -> int:
        return len(backend.rows_of(options["table"], "default"))  # expired ones included

    await store.put_many([f"e{i}" for i in range(20)], [{"i": i} for i in range(20)], ttl=0.05)
    await store.put("stays", {"v": 1})
    await anyio.sleep(0.1)
    assert await store.get_many(["e0", "e19", "stays"]) == [None, None, {"v": 1}]  # invisible at once
    assert await store.keys() == ["stays"]
    assert rows() == 21  # not yet reclaimed (the sweep ran first)
    await store.cull()
    assert rows() == 1

    sweeping = await backend.open(namespace, sweep_interval=0)  # every write sweeps
    try:
        await sweeping.put_many(["s1", "s2"], [{"v": 1}, {"v": 2}], ttl=0.05)
        await anyio.sleep(0.1)
        await sweeping.put("trigger", {"v": 1})
        assert rows() == 2  # stays, trigger
    finally:
        await sweeping.aclose()


@sql_rows
async def test_an_expired_row_is_taken_over_never_resurrected(store: Any) -> None:
    await store.put("k", {"v": "old"}, ttl=0.05)
    await anyio.sleep(0.1)
    assert await store.pop("k") is None
    assert await store.delete("k") is False
    await store.put("k", {"v": "old"}, ttl=0.05)
    await anyio.sleep(0.1)
    assert await store.update("k", lambda old: {"seen": old}) == {"seen": None}
    assert await store.ttl("k") == ({"seen": None}, None)
    await store.put("t", {"v": 1}, ttl=0.05)
    await anyio.sleep(0.1)
    assert await store.put_if_absent("t", {"v": 2}, ttl=30) is True
    value, remaining = await store.ttl("t")
    assert value == {"v": 2} and remaining is not None and 29 < remaining <= 30


@sql_rows
def test_sigkilled_writer_never_leaves_a_partial_put_many(backend: Backend, namespace: str) -> None:
    url, options = backend.url(namespace)
    table = options["table"]
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    newest, writes_interrupted = -1, 0
    for kill in range(KILLS):
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.support.workers", "crash", url, str(newest + 1), table],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        first = ""
        if kill % 2:  # let it write, then kill it mid-loop
            ready, _, _ = select.select([child.stdout], [], [], 30)
            first = child.stdout.readline() if ready else ""
            time.sleep(rng.uniform(0, 0.05))
        else:  # anywhere from start-up (creating the table) to writing
            time.sleep(rng.uniform(0, 0.6))
        child.kill()
        output = first + child.communicate(timeout=30)[0]
        assert child.returncode == -9, f"seed {seed}, kill {kill}: child exited with {child.returncode}: {output}"
        acknowledged = [int(line) for line in output.split("\n")[:-1]]
        writes_interrupted += bool(acknowledged)
        committed = {key: json.loads(text) for key, text in backend.rows_of(table, "batches").items()}
        newest = max(newest, newest_whole_batch(committed))
        assert max(acknowledged, default=-1) <= newest, f"seed {seed}, kill {kill}: an acknowledged batch was lost"
    assert writes_interrupted >= KILLS // 2, "too few kills interrupted a writing child to test anything"


@sql_rows
async def test_nothing_listening_raises_connection_error_within_timeout(backend: Backend, namespace: str) -> None:
    url, options = backend.url(namespace)
    parts = urlsplit(url)
    nowhere = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{free_port()}"))
    async with open_store(nowhere, **{**options, "timeout": TIMEOUT}) as store:
        operations: list[Callable[[], Awaitable[Any]]] = [lambda: store.get("k"), lambda: store.put("k", {"v": 1})]
        await assert_connection_errors(operations, TIMEOUT + 1, backend.driver_errors)


# -- the table, its options and its schema ---------------------------------------------------


@sql_rows
def test_table_must_be_an_identifier(backend: SQLBackend) -> None:
    kind, q = backend.store_class, backend.quote
    longest = kind._max_name
    bad = ["", "1a", "a-b", f"a{q}b", "a b", "a.b.c", ".a", "a.", "x" * (longest + 1), "kv;DROP", "\u00e9"]
    for table in [*bad, "s" * (kind._max_part + 1) + ".t"]:
        with pytest.raises(ValueError, match="table must be"):
            kind(backend.database_url, table=table)
    for table, quoted in [("Kv_1", f"{q}Kv_1{q}"), ("s.t", f"{q}s{q}.{q}t{q}"), ("x" * longest, q + "x" * longest + q)]:
        assert kind(backend.database_url, table=table).table == quoted


@sql_rows
@pytest.mark.parametrize(("cache", "prepared"), [(0, False), (100, True)])
async def test_statement_cache_size(backend: SQLBackend, namespace: str, cache: int, prepared: bool) -> None:
    """Without a cache (PgBouncer in transaction mode, a proxy that cannot route prepared
    statements) nothing is prepared on the server; with one, each statement shape once."""
    url, options = backend.url(namespace)
    store = open_store(f"{url}?statement_cache_size={cache}&max_connections=1", **options)
    assert isinstance(store, backend.store_class)
    try:
        await store.get("k")
        before = await backend.prepared(store)
        for _ in range(2):  # the second run reuses what the first prepared
            await exercise(store)
        assert (await backend.prepared(store) > before) is prepared
        for size in range(1, 70):  # bulk statements come in a few shapes
            keys = [f"k{i}" for i in range(size)]
            await store.put_many(keys, [{"i": i} for i in range(size)])
            assert await store.get_many(keys) == [{"i": i} for i in range(size)]
            assert await store.delete_many(keys) == size
        assert await backend.prepared(store) - before < (40 if prepared else 1)
    finally:
        await store.aclose()


@sql_rows
async def test_destroy_deletes_only_its_own_rows(backend: SQLBackend, namespace: str, store: Any) -> None:
    neighbour = backend.quoted(f"{backend.table_name(namespace)[:40]}_neighbour")
    run_sql = backend.run_sql
    run_sql(backend.database_url, f"CREATE TABLE {neighbour} (id int)", f"INSERT INTO {neighbour} VALUES (1), (2)")
    other = await backend.open(namespace + "_other")
    try:
        await store.put_many(["a", "b"], [{"v": 1}, {"v": 2}], collection="c")
        await store.put("expiring", {"v": 1}, ttl=0.01)
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
        run_sql(backend.database_url, f"DROP TABLE {neighbour}")


@sql_rows
async def test_other_schema_version_or_foreign_table_is_a_clear_error(
    backend: SQLBackend, namespace: str, store: Any
) -> None:
    run_sql = backend.run_sql
    await store.put("k", {"v": 1})
    set_version = f"UPDATE {store.table} SET value = {backend.mark(1)} WHERE collection = ''"
    run_sql(backend.database_url, (set_version, ("2",)))
    try:
        later = await backend.open(namespace)
        with pytest.raises(KVStoreError, match="schema version 2; this kvstores reads version 1"):
            await later.get("k")
        await later.aclose()
    finally:
        run_sql(backend.database_url, (set_version, (str(SCHEMA_VERSION),)))

    foreign = backend.quoted(f"{backend.table_name(namespace)[:40]}_foreign")
    run_sql(backend.database_url, f"CREATE TABLE {foreign} (id int)", f"INSERT INTO {foreign} VALUES (1)")
    async with backend.store_class(backend.database_url, table=foreign[1:-1]) as alien:
        with pytest.raises(KVStoreError) as caught:
            await alien.destroy()
        assert isinstance(caught.value.__cause__, backend.sql_error)
    assert run_sql(backend.database_url, f"SELECT count(*) FROM {foreign}")[0][0][0] == 1
    run_sql(backend.database_url, f"DROP TABLE {foreign}")


# -- timeouts on the row's server ------------------------------------------------------------


@sql_rows
async def test_pool_exhausted_raises_connection_error_within_timeout(backend: Backend, namespace: str) -> None:
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


@sql_rows
async def test_statement_blocked_by_a_lock_times_out_and_leaves_the_server(backend: SQLBackend, namespace: str) -> None:
    """A statement waiting on a lock past the store's timeout, or the server's, raises
    StoreConnectionError in time; the one the store gave up on is cancelled (or killed) on the
    server, so it waits no more and holds nothing."""
    client_side = await backend.open(namespace, timeout=0.5)
    server_side = await backend.open(namespace, timeout=5, **backend.lock_timeout(1.0))
    try:
        await client_side.put("k", {"v": 1})
        assert await server_side.get("k") == {"v": 1}
        async with backend.lock_row(client_side.table, "k"):
            for store, within, cause in [
                (client_side, 0.5, TimeoutError),  # the store's own deadline
                (server_side, 1.0, backend.sql_error),  # the server's lock timeout
            ]:
                started = time.monotonic()
                with pytest.raises(StoreConnectionError) as caught:
                    await store.put("k", {"v": 2})
                assert time.monotonic() - started < within + 1.5
                assert isinstance(caught.value.__cause__, cause)
            for _ in range(100):
                if not await backend.waiting_on_locks():
                    break
                await anyio.sleep(0.05)
            assert await backend.waiting_on_locks() == 0
        assert await client_side.get("k") == {"v": 1}
        assert await server_side.pop("k") == {"v": 1}
    finally:
        await client_side.destroy()
        await client_side.aclose()
        await server_side.aclose()


# -- faults on a private server --------------------------------------------------------------


@pytest.fixture(scope="module", params=ROWS)
def kind(request: pytest.FixtureRequest) -> type[Backend]:
    """The entry class of an SQL row (its driver imported)."""
    try:
        return entry_class(request.param)
    except ImportError as exc:
        skip_or_fail(marker(request.param), f"{request.param}: {exc}")


@pytest.fixture(scope="module")
def private_server(kind: type[Backend]) -> Iterator[PrivateServer]:
    """A server of this module's own (initialised once per row), running at the start of each test."""
    try:
        server = kind.private_server()
    except Unavailable as exc:
        skip_or_fail(marker(kind.name), f"no private {kind.name} server: {exc}")
    try:
        server.init()
        server.start()
    except Unavailable as exc:
        server.remove()
        skip_or_fail(marker(kind.name), f"no private {kind.name} server: {exc}")
    yield server
    server.remove()


@pytest.fixture
async def fault_store(private_server: PrivateServer) -> AsyncIterator[Any]:
    """A store on the private server whose calls time out after TIMEOUT seconds."""
    if not private_server.running:
        await anyio.to_thread.run_sync(private_server.start)
    store = open_store(private_server.url, timeout=TIMEOUT, table=f"t{uuid.uuid4().hex[:12]}")
    yield store
    await store.aclose()


async def _until_back(store: Any, key: str) -> Any:
    """``store.get(key)`` once the server answers again (at most 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await store.get(key)
        except StoreConnectionError:
            if time.monotonic() > deadline:
                raise
            await anyio.sleep(0.1)


async def test_server_stopped_mid_run_then_restarted(
    kind: type[Backend], private_server: PrivateServer, fault_store: Any
) -> None:
    store = fault_store
    keys = [f"k{i}" for i in range(100)]
    await store.put_many(keys, [{"i": i} for i in range(100)])
    seen: list[BaseException] = []
    stopping = asyncio.Event()

    async def load(worker: int) -> None:
        for n in range(100_000):  # bounded: the test sets ``stopping`` within seconds
            if stopping.is_set():
                return
            try:
                if n % 2:
                    await store.get(keys[(worker + n) % 100])
                else:
                    await store.put(f"load{worker}", {"n": n})
            except StoreConnectionError as exc:
                seen.append(exc)
                await anyio.sleep(0.01)

    loaders = [asyncio.create_task(load(worker)) for worker in range(4)]
    await anyio.sleep(0.3)
    await anyio.to_thread.run_sync(private_server.stop)  # clients disconnected mid-call
    operations: list[Callable[[], Awaitable[Any]]] = [
        lambda: store.get("k1"),
        lambda: store.put("k1", {"i": -1}),
        lambda: store.get_many(keys),
        lambda: store.put_many(keys[:2], [{}, {}]),
        lambda: store.pop("k3"),
        lambda: store.update("k4", lambda old: old),
        lambda: store.keys(),
    ]
    await assert_connection_errors(operations, TIMEOUT + 3, kind.driver_errors)
    stopping.set()
    await asyncio.gather(*loaders)  # any other exception in a loader fails the test here
    assert seen and all(isinstance(exc.__cause__, kind.driver_errors) for exc in seen)

    await anyio.to_thread.run_sync(private_server.start)
    assert await _until_back(store, "k2") == {"i": 2}  # the same store object
    await store.put("k1", {"i": 1})
    assert await store.get_many(keys[:5]) == [{"i": i} for i in range(5)]
    assert await store.pop("k3") == {"i": 3}
    assert await store.update("k4", lambda old: {"i": old["i"] * 10} if old else None) == {"i": 40}


async def test_server_crash_then_restart(kind: type[Backend], private_server: PrivateServer, fault_store: Any) -> None:
    store = fault_store
    await store.put("k", {"v": 1})
    await anyio.to_thread.run_sync(private_server.crash)
    await assert_connection_errors([lambda: store.get("k")], TIMEOUT + 3, kind.driver_errors)
    await anyio.to_thread.run_sync(private_server.start)
    assert await _until_back(store, "k") == {"v": 1}  # committed before the crash: recovered


async def test_store_made_while_the_server_is_down_works_once_it_is_up(
    kind: type[Backend], private_server: PrivateServer
) -> None:
    await anyio.to_thread.run_sync(private_server.stop)
    store = open_store(private_server.url, timeout=TIMEOUT, table="late")
    try:
        await assert_connection_errors([lambda: store.put("k", {"v": 1})], TIMEOUT + 3, kind.driver_errors)
        await anyio.to_thread.run_sync(private_server.start)
        assert await _until_back(store, "k") is None
        await store.put("k", {"v": 1})
        assert await store.get("k") == {"v": 1}
    finally:
        await store.aclose()
