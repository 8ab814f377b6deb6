"""Redis-specific tests: key layout, millisecond TTLs, Cluster slots, client ownership, faults."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis import exceptions as redis_errors
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import SSLConnection

from kvstores import DeserializationError, open_store
from kvstores.backends.redis import RedisStore, close_client
from tests.support import free_port
from tests.support.fixtures import assert_connection_errors, rows
from tests.support.redis import REDIS_URL, RedisBackend, RedisServer, own_redis

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

both = pytest.mark.parametrize("backend", rows("redis", "redis-cluster"), indirect=True)
"""Run a test on the machine's Redis and on the 3-master Cluster."""

cluster = pytest.mark.parametrize("backend", rows("redis-cluster"), indirect=True)
standalone = pytest.mark.parametrize("backend", rows("redis"), indirect=True)


def redis_key(store: RedisStore, collection: str, key: str) -> str:
    """The documented layout: prefix, the escaped collection as hash tag, the raw key."""
    tag = collection.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
    return f"{store.prefix}{{{tag}}}{key}"


async def raw_keys(store: RedisStore) -> set[str]:
    """Every Redis key under the store's prefix, read with the store's own client."""
    return {name.decode() async for name in store.client.scan_iter(match=f"{store.prefix}*")}


@both
async def test_ttl_is_milliseconds(store: RedisStore) -> None:
    client = store.client
    await store.put("half", {"v": 1}, ttl=0.5)
    assert 0 < await client.pttl(redis_key(store, "default", "half")) <= 500  # EX would round to 1 s
    await store.put_many(["m1", "m2"], [{"v": 1}, {"v": 2}], ttl=2.5)
    assert 2_000 < await client.pttl(redis_key(store, "default", "m2")) <= 2_500
    await store.put("ten", {"v": 1}, ttl=10)
    assert 9_000 <= await client.pttl(redis_key(store, "default", "ten")) <= 10_000
    await store.put("none", {"v": 1})
    assert await client.pttl(redis_key(store, "default", "none")) == -1
    _, remaining = await store.ttl("ten")
    assert remaining is not None and 9 <= remaining <= 10
    await asyncio.sleep(0.6)
    assert await store.get_many(["half", "ten", "none"]) == [None, {"v": 1}, {"v": 1}]


@both
async def test_put_without_ttl_clears_ttl_in_redis(store: RedisStore) -> None:
    await store.put("k", {"v": 1}, ttl=10)
    await store.put("k", {"v": 2})
    await store.put_many(["j"], [{"v": 1}], ttl=10)
    await store.put_many(["j"], [{"v": 2}])
    assert await store.client.pttl(redis_key(store, "default", "k")) == -1
    assert await store.client.pttl(redis_key(store, "default", "j")) == -1


@both
async def test_redis_keys_are_injective(store: RedisStore) -> None:
    pairs = [
        ("a::b", "c"),
        ("a", "b::c"),
        ("a", "}b"),
        ("a}", "b"),
        ("{a}", "b"),
        ("%7D", "b"),
        ("}", "b"),
        ("%", "7Db"),
        ("*", "k"),
        ("a*", "k"),
        ("[ab]", "k"),
        ("a", "k"),
        ("b", "k"),
        ("\\", "k"),
        ("?", "k"),
    ]
    for index, (collection, key) in enumerate(pairs):
        await store.put(key, {"i": index}, collection=collection)
    names = await raw_keys(store)
    assert names == {redis_key(store, collection, key) for collection, key in pairs}
    assert len(names) == len(pairs)
    for index, (collection, key) in enumerate(pairs):
        assert await store.get(key, collection=collection) == {"i": index}
        assert sorted(await store.keys(collection)) == sorted(k for c, k in pairs if c == collection)
    assert sorted(await store.collections()) == sorted({collection for collection, _ in pairs})
    assert await store.destroy_collection("*")
    assert await store.destroy_collection("a")
    assert sorted(await store.collections()) == sorted({c for c, _ in pairs} - {"*", "a"})
    assert await store.get("k", collection="a*") == {"i": 9}


@both
async def test_destroy_touches_only_its_prefix(store: RedisStore) -> None:
    client = store.client
    foreign = [
        f"{store.prefix}",
        f"{store.prefix}x{{default}}k",
        f"{store.prefix}-other",
        f"x{store.prefix}{{default}}k",
        f"{store.prefix}{{a%20b}}k",  # a tag kvstores never writes
        f"{store.prefix}{{unclosed",
    ]
    try:
        for name in foreign:
            await client.set(name, "foreign")
        await store.put("k", {"v": 1})
        assert await store.collections() == ["default"]
        assert await store.destroy()
        assert not await store.destroy()
        assert [await client.get(name) for name in foreign] == [b"foreign"] * len(foreign)
    finally:
        for name in foreign:
            await client.delete(name)


@both
async def test_limit_is_exact(store: RedisStore) -> None:
    await store.put_many([f"k{i}" for i in range(2_500)], [{"i": i} for i in range(2_500)])
    for i in range(5):
        await store.put("k", {"v": 1}, collection=f"c{i}")
    assert len(await store.keys(limit=1_234)) == 1_234
    assert len(set(await store.keys())) == 2_500
    assert len(await store.collections(limit=3)) == 3
    assert len(await store.collections()) == 6


@cluster
async def test_cluster_collection_shares_one_slot(store: RedisStore) -> None:
    client = store.client
    assert isinstance(client, RedisCluster)
    keys = [f"k{i}" for i in range(2_500)]  # several MGET/DEL chunks
    await store.put_many(keys, [{"i": i} for i in range(2_500)], ttl=60)
    assert await store.get_many(keys) == [{"i": i} for i in range(2_500)]
    assert [value for value, _ in await store.ttl_many(keys)] == [{"i": i} for i in range(2_500)]
    assert await store.delete_many(keys[:1_500]) == 1_500
    assert len(await store.keys()) == 1_000
    assert {client.keyslot(redis_key(store, "default", key)) for key in keys} == {
        client.keyslot(store.prefix + "{default}")
    }
    slots = {client.keyslot(redis_key(store, f"c{i}", "k")) for i in range(30)}
    assert len(slots) > 1  # collections spread over the Cluster
    for i in range(30):
        await store.put_many(["a", "b"], [{"i": i}, {"i": i}], collection=f"c{i}")
    assert len(await store.collections()) == 31
    assert await store.destroy()


@both
async def test_thousand_concurrent_operations(backend: Any, namespace: str) -> None:
    store = await backend.open(namespace)
    try:
        await asyncio.gather(*(store.put(f"k{i}", {"i": i}) for i in range(1_000)))
        values = await asyncio.gather(*(store.get(f"k{i}") for i in range(1_000)))
        assert values == [{"i": i} for i in range(1_000)]
        mixed = [store.ttl(f"k{i}") if i % 2 else store.delete(f"k{i}") for i in range(1_000)]
        await asyncio.gather(*mixed)
        assert len(await store.keys()) == 500
    finally:
        await store.destroy()
        await store.aclose()


@standalone
async def test_waiting_operations_can_be_cancelled(backend: Any, namespace: str) -> None:
    store = await backend.open(namespace, max_connections=1)
    try:
        tasks = [asyncio.create_task(store.put(f"k{i}", {"i": i})) for i in range(20)]
        await asyncio.sleep(0)
        for task in tasks[1::2]:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # no connection slot was lost: the store still serves many concurrent calls
        values = await asyncio.wait_for(asyncio.gather(*(store.get(f"k{i}") for i in range(20))), 10)
        assert [i for i, value in enumerate(values) if value is not None] == list(range(0, 20, 2))
    finally:
        await store.destroy()
        await store.aclose()


@both
async def test_user_client_is_not_closed(backend: RedisBackend, namespace: str) -> None:
    client = backend.async_client()
    try:
        async with RedisStore(client=client, prefix=namespace) as store:
            # concurrent first commands on a fresh client (redis-py's Cluster discovery race)
            await asyncio.gather(*(store.put(f"k{i}", {"i": i}) for i in range(50)))
        assert store.closed
        assert await client.ping()
        async with RedisStore(client=client, prefix=namespace) as again:
            assert await again.get("k7") == {"i": 7}
            assert await again.destroy()
    finally:
        await close_client(client)  # a Cluster client's aclose() can skip its nodes (see close_client)


@standalone
async def test_client_that_decodes_responses(backend: Any, namespace: str) -> None:
    client = Redis.from_url(REDIS_URL, decode_responses=True)
    store = RedisStore(client=client, prefix=namespace)
    try:
        await store.put("k", {"v": "é"}, collection="c")
        assert await store.get("k", collection="c") == {"v": "é"}
        assert await store.ttl_many(["k", "x"], collection="c") == [({"v": "é"}, None), (None, None)]
        assert await store.keys("c") == ["k"]
        assert await store.collections() == ["c"]
    finally:
        await store.destroy()
        await store.aclose()
        await client.aclose()


@standalone
async def test_undecodable_values_raise(store: RedisStore) -> None:
    await store.client.set(redis_key(store, "default", "bytes"), b"\xff\xfe")
    await store.client.set(redis_key(store, "default", "list"), b"[1]")
    for key in ("bytes", "list"):
        with pytest.raises(DeserializationError):
            await store.get(key)


async def test_url_and_options(namespace: str) -> None:
    store = open_store(f"{REDIS_URL}?prefix={namespace}&timeout=1.5&max_connections=7&socket_keepalive=false")
    assert isinstance(store, RedisStore)
    assert store.prefix == namespace
    client = store.client
    assert isinstance(client, Redis)
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["db"], kwargs["socket_keepalive"]) == (1.5, 15, False)
    assert client.connection_pool.max_connections == 7
    await store.aclose()
    tls_store = open_store("rediss://example.invalid:6380/2?ssl_cert_reqs=none&prefix=p")
    tls_pool = tls_store.client.connection_pool  # type: ignore[attr-defined]
    assert tls_pool.connection_class is SSLConnection
    assert (tls_pool.connection_kwargs["ssl_cert_reqs"], tls_pool.connection_kwargs["db"]) == ("none", 2)
    await tls_store.aclose()
    cluster_store = open_store("redis+cluster://127.0.0.1:7000", prefix="p")
    assert isinstance(cluster_store.client, RedisCluster)  # type: ignore[attr-defined]
    await cluster_store.aclose()
    for url in (
        f"{REDIS_URL}?nonsense=1",
        "rediss://127.0.0.1:1/0?nonsense=1",
        "redis+cluster://127.0.0.1:1?nonsense=1",
    ):
        with pytest.raises(ValueError, match=r"option is unknown to redis-py.*'nonsense'"):
            open_store(url)  # at once, not as a TypeError at the first call
    with pytest.raises(ValueError, match="prefix"):
        RedisStore(REDIS_URL, prefix="a{b")
    with pytest.raises(ValueError, match="prefix"):
        RedisStore(REDIS_URL, prefix="")
    with pytest.raises(TypeError):
        RedisStore()
    with pytest.raises(TypeError, match=r"redis\.asyncio"):
        RedisStore(client=redis.Redis())  # type: ignore[arg-type]  # the error under test


# -- faults: a redis-server of our own, stopped, hung and restarted ----------------------


@pytest.fixture
def folder() -> Iterator[Path]:
    """A short folder of the test's own (a unix socket's path must stay short)."""
    path = Path(tempfile.mkdtemp(prefix="kvstores-fault-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def own_server(folder: Path) -> Iterator[RedisServer]:
    """A redis-server on a free port, which the test may stop, pause and start again."""
    with own_redis(folder) as server:
        yield server


async def expect_unreachable(store: RedisStore, within: float) -> None:
    """Every kind of operation raises StoreConnectionError, caused by redis-py, within ``within`` (+3) seconds."""
    operations: list[Callable[[], Awaitable[Any]]] = [
        lambda: store.get("k1"),
        lambda: store.put("k1", {"v": 1}),
        lambda: store.ttl("k1"),
        lambda: store.get_many(["k1", "k2"]),
        lambda: store.put_many(["k1", "k2"], [{"v": 1}, {"v": 2}], ttl=5),
        lambda: store.delete("k1"),
        lambda: store.keys(),
    ]
    await assert_connection_errors(
        operations, within + 3, (redis_errors.RedisError, redis_errors.RedisClusterException)
    )


async def workload(store: RedisStore) -> None:
    await asyncio.gather(*(store.put(f"k{i}", {"i": i}, ttl=60) for i in range(100)))
    assert await store.get_many([f"k{i}" for i in range(100)]) == [{"i": i} for i in range(100)]


async def test_server_stopped_and_restarted(own_server: RedisServer) -> None:
    store = RedisStore(f"redis://127.0.0.1:{own_server.port}/0")  # default options: timeout 5 s
    try:
        await workload(store)
        own_server.stop()
        await expect_unreachable(store, within=5)
        own_server.start()
        await workload(store)  # the same store object, with no ceremony
        assert len(await store.keys()) == 100
    finally:
        await store.aclose()


async def test_server_hung_then_resumed(own_server: RedisServer) -> None:
    store = RedisStore(f"redis://127.0.0.1:{own_server.port}/0", timeout=0.5)
    try:
        await workload(store)
        own_server.pause()
        await expect_unreachable(store, within=0.5)
        own_server.resume()
        await workload(store)
    finally:
        await store.aclose()


async def test_unix_socket(folder: Path) -> None:
    socket_path = folder / "redis.sock"
    with own_redis(folder, "--unixsocket", str(socket_path)):
        store = open_store(f"unix://{socket_path}?db=3&prefix=p")
        try:
            await store.put("k", {"v": 1}, ttl=5)
            value, remaining = await store.ttl("k")
            assert value == {"v": 1}
            assert remaining is not None and 4 < remaining <= 5
        finally:
            await store.aclose()


async def test_nothing_listening() -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout=1)
    try:
        await expect_unreachable(store, within=1)
    finally:
        await store.aclose()


@cluster
async def test_a_cluster_store_closed_after_a_timeout_leaves_no_socket_open(
    backend: RedisBackend, namespace: str
) -> None:
    """redis-py's RedisCluster.aclose() closes nothing while a timeout has it marked for re-initialization."""
    import gc
    import warnings

    url, options = backend.url(namespace)
    store = open_store(url, **{**options, "timeout": 0.2})
    await store.put("k", {"v": 1})
    with pytest.raises(redis_errors.TimeoutError):
        await store.client.blpop([f"{namespace}{{k}}list"], timeout=2)  # outlasts the socket timeout
    assert store.client._initialize, "redis-py no longer marks a timed-out cluster client: this test checks nothing"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        await store.aclose()
        del store
        gc.collect()
    assert [str(warning.message) for warning in caught if warning.category is ResourceWarning] == []
