"""MongoDB-specific tests: storage layout, fidelity, TTL fields, client ownership, faults."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from kvstores import (
    MAX_DEPTH,
    MAX_VALUE_BYTES,
    DeserializationError,
    StoreConnectionError,
    ValueTooLargeError,
    open_store,
)
from kvstores.backends.mongodb import MongoDBStore
from tests.support import Unavailable
from tests.support.fixtures import assert_connection_errors, rows, skip_or_fail
from tests.support.mongodb import MongoDBBackend, SecantusServer

pytestmark = [pytest.mark.anyio, pytest.mark.mongodb]

both_clients = pytest.mark.parametrize("backend", rows("mongodb", "mongodb-motor"), indirect=True)
"""Run a test with a store that creates its pymongo client, and with a motor client."""


@pytest.fixture
async def raw(backend: MongoDBBackend, store: MongoDBStore) -> AsyncIterator[Any]:
    """The store's MongoDB collection, through a separate pymongo client."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(backend.server_url, tz_aware=True)
    yield client[store.database][store.mongo_collection]
    await client.close()


@both_clients
async def test_fidelity(store: MongoDBStore) -> None:
    deep: Any = True
    for level in range(MAX_DEPTH - 1):  # the deepest nesting allowed: the value's own dict is one more level
        deep = [deep] if level % 2 else {"d": deep}
    value = {
        "big": 2**64 + 1,
        "huge": -(10**100),
        "$set": {"$in": [1]},
        "a.b": {"": "empty key", ".": "."},
        "nul": "a\x00b",
        "deep": deep,
    }
    await store.put("k\x00.$", value)
    assert await store.get("k\x00.$") == value
    assert await store.get_many(["k\x00.$"]) == [value]


@both_clients
async def test_one_document_per_pair(store: MongoDBStore, raw: Any) -> None:
    pairs = [("ab", "c"), ("a", "bc"), ("1:a", "bc"), ("a", "1:abc"), ("2:ab", ""), ("default", "k")]
    for collection, key in pairs:
        await store.put(key, {"pair": [collection, key]}, collection=collection)
    await store.put_many(["k"], [{"pair": ["default", "k"]}])
    documents = await raw.find({}).to_list(None)
    assert sorted((d["c"], d["_id"]) for d in documents) == sorted((c, f"{len(c)}:{c}{k}") for c, k in pairs)
    for collection, key in pairs:
        assert await store.get(key, collection=collection) == {"pair": [collection, key]}


@both_clients
async def test_listing_by_id_range_at_code_point_edges(store: MongoDBStore) -> None:
    names = ["\U0010ffff", "\U0010ffff\U0010ffff", "a\U0010ffff", "b", "\ud7ff", "\ue000", "1:", "1", ";"]
    for name in names:
        await store.put_many([name, "k"], [{"c": name}, {"c": name}], collection=name)
    for name in names:
        assert sorted(await store.keys(collection=name)) == sorted([name, "k"])
    assert sorted(await store.collections()) == sorted(names)
    assert await store.destroy_collection("\U0010ffff") is True
    assert sorted(await store.collections()) == sorted(names[1:])


@both_clients
async def test_concurrent_first_writes_never_duplicate(
    backend: MongoDBBackend, namespace: str, store: MongoDBStore, raw: Any
) -> None:
    peers = [await backend.open(namespace) for _ in range(3)]
    try:
        writers = [peer for peer in [store, *peers] for _ in range(10)]
        for round_ in range(5):
            key = f"first-{round_}"
            await asyncio.gather(*(writer.put(key, {"w": i}) for i, writer in enumerate(writers)))
            await asyncio.gather(
                *(writer.put_many([key, f"{key}-b"], [{"w": i}, {"w": i}]) for i, writer in enumerate(writers))
            )
            assert await raw.count_documents({"_id": f"7:default{key}"}) == 1
            assert await store.get(key) in [{"w": i} for i in range(len(writers))]
    finally:
        for peer in peers:
            await peer.aclose()


@both_clients
async def test_ttl_index_and_expiry_field(store: MongoDBStore, raw: Any) -> None:
    await store.put("k", {"v": 1}, ttl=60)
    indexes = await raw.index_information()
    assert [(spec["expireAfterSeconds"], spec["sparse"]) for spec in indexes.values() if spec["key"] == [("e", 1)]] == [
        (0, True)
    ]
    assert (await raw.find_one({"_id": "7:defaultk"}))["e"] is not None
    await store.put("k", {"v": 2})
    assert "e" not in await raw.find_one({"_id": "7:defaultk"})
    await store.put_many(["k"], [{"v": 3}], ttl=60)
    await store.put_many(["k"], [{"v": 4}])
    assert "e" not in await raw.find_one({"_id": "7:defaultk"})


@both_clients
async def test_ttl_to_the_millisecond(store: MongoDBStore, raw: Any) -> None:
    before = time.time()
    await store.put("k", {"v": 1}, ttl=1.2345)
    after = time.time()
    expiry = (await raw.find_one({"_id": "7:defaultk"}))["e"].timestamp()
    assert before + 1.2345 - 0.001 <= expiry <= after + 1.2345
    _, remaining = await store.ttl("k")
    assert remaining is not None
    assert expiry - time.time() - 0.002 <= remaining <= 1.2345


@both_clients
async def test_expired_entry_is_reclaimed(store: MongoDBStore, raw: Any) -> None:
    await store.put("gone", {"v": 1}, ttl=0.05)
    await store.put("stays", {"v": 1})
    await anyio.sleep(0.1)
    await store.cull()
    assert [d["_id"] for d in await raw.find({}).to_list(None)] == ["7:defaultstays"]


@both_clients
async def test_destroy_keeps_other_collections_of_the_database(store: MongoDBStore, raw: Any) -> None:
    neighbour = raw.database["not_kvstores"]
    await neighbour.insert_one({"_id": 1})
    await store.put("k", {"v": 1})
    assert await store.destroy() is True
    assert await raw.count_documents({}) == 0
    assert await neighbour.count_documents({}) == 1
    await neighbour.drop()


@both_clients
async def test_stored_document_without_text_is_a_deserialization_error(store: MongoDBStore, raw: Any) -> None:
    await raw.insert_one({"_id": "7:defaultalien", "c": "default", "v": {"not": "text"}})
    with pytest.raises(DeserializationError):
        await store.get("alien")


@pytest.mark.parametrize("backend", rows("mongodb"), indirect=True)
async def test_user_client_is_not_closed(backend: MongoDBBackend, namespace: str) -> None:
    from motor.motor_asyncio import AsyncIOMotorClient

    pymongo_client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(backend.server_url)
    motor_client: AsyncIOMotorClient[dict[str, Any]] = AsyncIOMotorClient(backend.server_url)
    try:
        for client in (pymongo_client, motor_client):
            async with MongoDBStore(client, **backend.options(namespace, {})) as store:
                await store.put("k", {"v": 1})
                await store.destroy()
            assert (await client.admin.command("ping"))["ok"] == 1
    finally:
        await pymongo_client.close()
        motor_client.close()


@pytest.mark.parametrize("backend", rows("mongodb"), indirect=True)
async def test_aclose_returns_when_the_clients_close_never_does(
    backend: MongoDBBackend, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A store's close is bounded by its timeout (CI once hung in a store's teardown for good)."""
    # never used: no operation meets the short timeout on a loaded machine, and the client is closed all the same
    store = MongoDBStore(backend.server_url, **backend.options(namespace, {"timeout": 0.5}))
    client = store._client
    entered = asyncio.Event()

    async def close_never() -> None:
        entered.set()
        await asyncio.Event().wait()

    client.close, close = close_never, client.close
    try:
        with caplog.at_level("WARNING", logger="kvstores.backends.mongodb"):
            await asyncio.wait_for(store.aclose(), 10)  # the bound under test is 0.5 s; 10 s only ends a defect
        assert entered.is_set()
        assert any("closing the client took over 0.5 s" in record.getMessage() for record in caplog.records)
    finally:
        await close()


async def test_value_too_large_before_any_round_trip() -> None:
    store = MongoDBStore("mongodb://127.0.0.1:9/", timeout=30)  # nothing listens there
    started = time.monotonic()
    with pytest.raises(ValueTooLargeError):
        await store.put("k", {"v": "x" * MAX_VALUE_BYTES})
    with pytest.raises(ValueTooLargeError):
        await store.put_many(["a", "b"], [{"v": 1}, {"v": "x" * MAX_VALUE_BYTES}])
    assert time.monotonic() - started < 5
    await store.aclose()


def test_options_from_url() -> None:
    store = open_store("mongodb://127.0.0.1:9/mydb?appname=x", collection="entries")
    assert isinstance(store, MongoDBStore)
    assert (store.database, store.mongo_collection) == ("mydb", "entries")
    assert MongoDBStore("mongodb://127.0.0.1:9", database="other").database == "other"
    assert MongoDBStore("mongodb://127.0.0.1:9").database == "kvstores"


def test_sync_client_rejected() -> None:
    from pymongo import MongoClient

    client: MongoClient[dict[str, Any]] = MongoClient("mongodb://127.0.0.1:9", connect=False)
    with client, pytest.raises(TypeError):
        MongoDBStore(client)


# -- faults --------------------------------------------------------------------------------

TIMEOUT = 1.0


@pytest.fixture
def server(tmp_path: Path) -> Any:
    """Our own SecantusDB on disk (data survives a restart), stopped afterwards."""
    server = SecantusServer(storage_path=str(tmp_path / "data"))
    try:
        server.start()
    except Unavailable as exc:
        skip_or_fail("mongodb", str(exc))
    yield server
    server.stop()


@pytest.fixture(params=["pymongo", "motor"])
async def fault_store(request: pytest.FixtureRequest, server: SecantusServer) -> AsyncIterator[MongoDBStore]:
    """A store on ``server`` whose operations time out after TIMEOUT seconds."""
    if request.param == "pymongo":
        store = MongoDBStore(server.url, database="fault", timeout=TIMEOUT)
        yield store
        await store.aclose()
        return
    from motor.motor_asyncio import AsyncIOMotorClient

    ms = int(TIMEOUT * 1000)
    client: AsyncIOMotorClient[dict[str, Any]] = AsyncIOMotorClient(
        server.url, serverSelectionTimeoutMS=ms, connectTimeoutMS=ms, socketTimeoutMS=ms
    )
    yield MongoDBStore(client, database="fault")
    client.close()


async def test_outage_raises_connection_error_then_store_recovers(
    server: SecantusServer, fault_store: MongoDBStore
) -> None:
    store = fault_store
    keys = [f"k{i}" for i in range(100)]
    await store.put_many(keys, [{"i": i} for i in range(100)])
    await asyncio.gather(*(store.get(key) for key in keys[:20]))

    await anyio.to_thread.run_sync(server.stop)
    operations: list[Callable[[], Awaitable[Any]]] = [
        lambda: store.get("k1"),
        lambda: store.put("k1", {"i": -1}),
        lambda: store.get_many(keys),
        lambda: store.keys(),
    ]
    await assert_connection_errors(operations, TIMEOUT + 3, PyMongoError)

    await anyio.to_thread.run_sync(server.start)
    deadline = time.monotonic() + 15
    while True:
        try:
            value = await store.get("k2")
            break
        except StoreConnectionError:
            if time.monotonic() > deadline:
                raise
    assert value == {"i": 2}
    await store.put("k1", {"i": 1})
    assert await store.get_many(keys[:2]) == [{"i": 0}, {"i": 1}]
