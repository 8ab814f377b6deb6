"""The MCP client's storage slots on every backend of the table, through the SDK's and FastMCP's own code.

- the SDK's client response cache (``mcp.client.caching.ResponseCacheStore``, SEP-2549) filled
  two ways: :class:`kvstores.client.StoreResponseCacheStore` and FastMCP's
  ``KeyValueResponseCacheStore(storage=...)`` over a kvstores store; a FastMCP client with
  ``cache=CacheConfig(store=...)`` lists the tools of a server that hints ``ttlMs``;
- the SDK's OAuth client ``TokenStorage``: :class:`kvstores.client.StoreTokenStorage`.

Each shows the state lives in the store (a new store object, as after a restart, carries on
from it; not on memory, whose store objects share nothing) and that it expires on time.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from fastmcp import Client, FastMCP
from fastmcp.client.caching import KeyValueResponseCacheStore
from fastmcp.server.middleware import Middleware
from mcp.client.auth import TokenStorage
from mcp.client.caching import CacheConfig, CacheEntry, CacheKey, ResponseCacheStore
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from mcp_types import ListToolsResult, Tool
from pydantic import AnyUrl

from kvstores.client import DEFAULT_RESPONSE_CACHE_COLLECTION, StoreResponseCacheStore, StoreTokenStorage
from tests.support import Backend

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

CacheFactory = Callable[[Any], ResponseCacheStore]

CACHE_STORES: dict[str, tuple[CacheFactory, str]] = {
    "kvstores": (StoreResponseCacheStore, DEFAULT_RESPONSE_CACHE_COLLECTION),
    "fastmcp": (lambda store: KeyValueResponseCacheStore(storage=store), "fastmcp_response_cache"),
}
"""How each slot filler is made from a kvstores store, and the collection it writes to."""


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 6.0) -> None:
    """Poll ``check`` until it holds; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.1)


async def reopened(backend: Backend, namespace: str, store: Any) -> Any:
    """A new store object on ``namespace`` (a restart), or ``store`` itself on memory."""
    return await backend.open(namespace) if backend.persistent else store


# -- the client response cache ------------------------------------------------------------------


class ListingServer:
    """A FastMCP server that hints a ``ttlMs`` on its listings and counts the tools/list it answers."""

    def __init__(self, ttl: int) -> None:
        self.listings = 0
        self.server: FastMCP[Any] = FastMCP("response-cache-slot", cache_ttl=ttl)
        server = self

        class Counting(Middleware):
            async def on_list_tools(self, context: Any, call_next: Any) -> Any:
                server.listings += 1
                return await call_next(context)

        self.server.add_middleware(Counting())

        @self.server.tool
        def hello() -> str:
            """Say hello."""
            return "hello"

    async def list_tools(self, cache: ResponseCacheStore, partition: str = "tenant-a") -> list[str]:
        """List the tools through a fresh client whose response cache is ``cache``."""
        config = CacheConfig(store=cache, partition=partition, target_id="response-cache-slot")
        async with Client(self.server, cache=config) as client:
            return [tool.name for tool in await client.list_tools()]


@pytest.mark.parametrize("filler", sorted(CACHE_STORES))
async def test_response_cache_is_shared_survives_a_restart_and_expires(
    filler: str, backend: Backend, namespace: str, store: Any
) -> None:
    make, collection = CACHE_STORES[filler]
    server = ListingServer(ttl=2)
    assert await server.list_tools(make(store)) == ["hello"]
    assert await server.list_tools(make(store)) == ["hello"]  # another client, same store: a hit
    assert server.listings == 1
    ttls = [ttl for _, ttl in await store.ttl_many(await store.keys(collection), collection=collection)]
    assert len(ttls) == 1 and ttls[0] is not None and 0 < ttls[0] <= 2

    other = await reopened(backend, namespace, store)
    try:
        assert await server.list_tools(make(other)) == ["hello"]
        assert server.listings == 1  # served from what the first store object wrote
        assert await server.list_tools(make(other), partition="tenant-b") == ["hello"]
        assert server.listings == 2  # another principal's partition: a miss

        async def expired() -> bool:
            return not await store.keys(collection)

        await eventually(expired)
        assert await server.list_tools(make(other)) == ["hello"]
        assert server.listings == 3
    finally:
        if other is not store:
            await other.aclose()


def cached_tools(ttl: float, *names: str) -> CacheEntry:
    """A cache entry of a tools/list result, fresh for ``ttl`` seconds."""
    tools = [Tool(name=name, input_schema={"type": "object"}) for name in names]
    return CacheEntry(value=ListToolsResult(tools=tools), scope="private", expires_at=time.time() + ttl)


async def test_response_cache_entries_round_trip_and_keys_fold_the_partition(store: Any) -> None:
    cache = StoreResponseCacheStore(store)
    keys = [CacheKey("tools/list", "", "a"), CacheKey("tools/list", "", "b"), CacheKey("tools/list", "a", "")]
    for index, key in enumerate(keys):
        await cache.set(key, cached_tools(60, f"tool{index}"))
    for index, key in enumerate(keys):
        entry = await cache.get(key)
        assert entry is not None and isinstance(entry.value, ListToolsResult)
        assert [tool.name for tool in entry.value.tools] == [f"tool{index}"]
        assert entry.scope == "private"
    assert len({cache.store_key(key) for key in keys}) == 3
    await cache.delete(keys[0])
    assert await cache.get(keys[0]) is None and await cache.get(keys[1]) is not None


async def test_response_cache_stores_nothing_stale(store: Any) -> None:
    cache = StoreResponseCacheStore(store)
    key = CacheKey("tools/list", "", "a")
    await cache.set(key, cached_tools(60, "fresh"))
    await cache.set(key, cached_tools(-1, "stale"))  # replaced by an entry already stale: nothing
    assert await cache.get(key) is None
    assert not await store.keys(DEFAULT_RESPONSE_CACHE_COLLECTION)
    with pytest.raises(TypeError, match="cacheable result"):
        await cache.set(key, CacheEntry(value={"tools": []}, scope="private", expires_at=time.time() + 60))


@pytest.mark.parametrize(
    "stored",
    [
        {"v": 99, "model": "mcp_types._types.ListToolsResult", "value": {"tools": []}, "scope": "private"},
        {"v": 1, "model": "os.system", "value": {"tools": []}, "scope": "private", "expires_at": 1e12},
        {"v": 1, "model": "mcp_types._types.ListToolsResult", "value": {"tools": 3}, "scope": "private"},
        {"v": 1, "model": "mcp_types._types.ListToolsResult", "value": {"tools": []}, "scope": "x", "expires_at": 1},
        {"something": "else"},
    ],
    ids=["version", "unknown-model", "wrong-value", "wrong-scope", "foreign"],
)
async def test_response_cache_wrong_shape_entries_are_a_miss(store: Any, stored: dict[str, Any]) -> None:
    cache = StoreResponseCacheStore(store)
    key = CacheKey("tools/list", "", "a")
    await store.put(cache.store_key(key), stored, collection=cache.collection)
    assert await cache.get(key) is None


async def test_response_cache_clear_never_leaves_its_collection(store: Any) -> None:
    mine, theirs = StoreResponseCacheStore(store), StoreResponseCacheStore(store, collection="other-cache")
    key = CacheKey("tools/list", "", "a")
    await mine.set(key, cached_tools(60, "mine"))
    await theirs.set(key, cached_tools(60, "theirs"))
    await store.put("k", {"unrelated": True})
    await mine.clear()
    assert await mine.get(key) is None
    assert await theirs.get(key) is not None
    assert await store.get("k") == {"unrelated": True}
    await mine.set(key, cached_tools(60, "again"))  # the collection stays usable
    assert await mine.get(key) is not None


def test_response_cache_needs_a_store_it_can_clear() -> None:
    class GetPutOnly:
        async def get(self, key: str, *, collection: str | None = None) -> None:
            return None

    with pytest.raises(TypeError, match="clear"):
        StoreResponseCacheStore(GetPutOnly())  # type: ignore[arg-type]


# -- the OAuth client's TokenStorage ------------------------------------------------------------


def test_token_storage_has_the_sdk_protocol_methods() -> None:
    for name, member in inspect.getmembers(TokenStorage, inspect.isfunction):
        if not name.startswith("_"):
            ours = getattr(StoreTokenStorage, name)
            assert inspect.iscoroutinefunction(ours), name
            assert list(inspect.signature(ours).parameters) == list(inspect.signature(member).parameters), name


def registration(secret_expires_in: int | None) -> OAuthClientInformationFull:
    return OAuthClientInformationFull(
        client_id="client-1",
        client_secret="client-secret-text",
        client_secret_expires_at=None if secret_expires_in is None else int(time.time()) + secret_expires_in,
        redirect_uris=[AnyUrl("http://127.0.0.1:9/callback")],
    )


async def test_token_storage_survives_a_restart(backend: Backend, namespace: str, store: Any) -> None:
    storage = StoreTokenStorage(store, key="https://mcp.example/mcp")
    tokens = OAuthToken(access_token="access-1", expires_in=3600, refresh_token="refresh-1", scope="read")
    await storage.set_tokens(tokens)
    await storage.set_client_info(registration(None))
    await StoreTokenStorage(store, key="https://other.example/mcp").set_tokens(OAuthToken(access_token="other"))

    other = await reopened(backend, namespace, store)
    try:
        again = StoreTokenStorage(other, key="https://mcp.example/mcp")
        loaded = await again.get_tokens()
        assert loaded is not None and loaded.access_token == "access-1" and loaded.refresh_token == "refresh-1"
        assert loaded.expires_in is not None and 3590 <= loaded.expires_in <= 3600  # what remains of it
        assert await again.get_client_info() == registration(None)
        assert await StoreTokenStorage(other, key="nobody").get_tokens() is None
    finally:
        if other is not store:
            await other.aclose()


async def test_token_storage_expires_with_the_tokens_and_the_client_secret(store: Any) -> None:
    storage = StoreTokenStorage(store, key="https://mcp.example/mcp")
    renewable = StoreTokenStorage(store, key="renewable", refresh_token_ttl=60)
    await storage.set_tokens(OAuthToken(access_token="short", expires_in=1))
    await storage.set_client_info(registration(2))
    await renewable.set_tokens(OAuthToken(access_token="short", expires_in=1, refresh_token="refresh"))

    async def expired() -> bool:
        return await storage.get_tokens() is None and await storage.get_client_info() is None

    await eventually(expired)
    kept = await renewable.get_tokens()  # a refresh token outlives its access token
    assert kept is not None and kept.refresh_token == "refresh" and kept.expires_in == 0

    await storage.set_client_info(registration(-5))  # already expired: not stored
    await storage.set_tokens(OAuthToken(access_token="dead", expires_in=0))
    assert await storage.get_client_info() is None and await storage.get_tokens() is None
