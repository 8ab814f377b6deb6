"""FastMCP's store slots through only the API FastMCP 3.x and 4.x share: what .ci/compat-matrix runs per row.

Each row of the matrix names the features it expects in ``KVSTORES_COMPAT_EXPECT``
(comma-separated, from :data:`FEATURES`; unset: every feature). A test of an expected feature
fails when FastMCP lacks it; a test of a feature the row does not expect is skipped, and
fails if the feature is there after all (so a row's list is exactly what it runs).
Every test runs on each backend of the table, with a restart (a new store object) and an
expiry check.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from importlib.metadata import version
from typing import Any

import pytest
from fastmcp import Client, Context, FastMCP

from tests.support import Backend

pytestmark = pytest.mark.anyio

FEATURES = {
    "session-state": ("fastmcp.server.context", "Context.set_state"),
    "response-caching": ("fastmcp.server.middleware.caching", "ResponseCachingMiddleware"),
    "oauth-client-storage": ("fastmcp.client.auth.oauth", "TokenStorageAdapter"),
}
"""Feature -> (module, attribute path) whose presence means FastMCP has the slot."""


def feature(name: str) -> Any:
    """The object behind feature ``name``; fail or skip as the row's expectations say when it is absent."""
    expected = os.environ.get("KVSTORES_COMPAT_EXPECT")
    wanted = expected is None or name in {item.strip() for item in expected.split(",")}
    module_name, path = FEATURES[name]
    try:
        found: Any = importlib.import_module(module_name)
        for part in path.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        if wanted:
            pytest.fail(f"{name}: expected with fastmcp {version('fastmcp')}, but {exc!r}")
        pytest.skip(f"{name}: not in fastmcp {version('fastmcp')} (and this row does not expect it)")
    if not wanted:
        pytest.fail(f"{name}: fastmcp {version('fastmcp')} has it but this row does not expect it; add it")
    return found


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 6.0) -> None:
    """Poll ``check`` until it holds; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.1)


def handshake_client(server: FastMCP[Any]) -> Client[Any]:
    """An in-process client on a handshake session (FastMCP 4 defaults to sessionless modern calls)."""
    legacy = {"mode": "legacy"} if "mode" in inspect.signature(Client).parameters else {}
    return Client(server, **legacy)


async def reopened(backend: Backend, namespace: str, store: Any) -> Any:
    """A new store object on ``namespace`` (a restart), or ``store`` itself on memory."""
    return await backend.open(namespace) if backend.persistent else store


async def live(store: Any, collection: str) -> dict[str, float | None]:
    """Key -> remaining TTL of every live entry of ``collection``."""
    keys = await store.keys(collection)
    return {key: ttl for key, (_, ttl) in zip(keys, await store.ttl_many(keys, collection=collection))}


async def test_session_state(backend: Backend, namespace: str, store: Any) -> None:
    feature("session-state")

    server: FastMCP[Any] = FastMCP("compat-state", session_state_store=store)

    @server.tool
    async def remember(text: str, ctx: Context) -> None:
        """Keep ``text`` in this session's state."""
        await ctx.set_state("note", text)

    @server.tool
    async def recall(ctx: Context) -> str | None:
        """This session's note."""
        note: str | None = await ctx.get_state("note")
        return note

    async with handshake_client(server) as alice, handshake_client(server) as bob:
        await alice.call_tool("remember", {"text": "alice's"})
        assert (await alice.call_tool("recall", {})).data == "alice's"
        assert (await bob.call_tool("recall", {})).data is None  # isolated

    entries = {}
    for collection in await store.collections():
        entries.update(await live(store, collection))
    assert entries and all(ttl is not None and 86_000 < ttl <= 86_400 for ttl in entries.values())
    other = await reopened(backend, namespace, store)
    try:  # after a restart, the state is still in the store, expiring at the same time
        assert sum([len(await live(other, collection)) for collection in await other.collections()]) == len(entries)
    finally:
        if other is not store:
            await other.aclose()


async def test_response_caching_middleware(backend: Backend, namespace: str, store: Any) -> None:
    middleware = feature("response-caching")

    runs: list[str] = []

    def counting_server(cache_storage: Any, ttl: int) -> FastMCP[Any]:
        server: FastMCP[Any] = FastMCP("compat-caching")
        server.add_middleware(middleware(cache_storage=cache_storage, call_tool_settings={"ttl": ttl}))

        @server.tool
        def count(label: str) -> int:
            """Run once per call that misses the cache."""
            runs.append(label)
            return len(runs)

        return server

    async def call(server: FastMCP[Any]) -> int:
        async with Client(server) as client:
            answer: int = (await client.call_tool("count", {"label": "a"})).data
        return answer

    assert [await call(counting_server(store, ttl=2)), await call(counting_server(store, ttl=2))] == [1, 1]
    other = await reopened(backend, namespace, store)
    try:
        assert await call(counting_server(other, ttl=2)) == 1  # a restarted server is served from the store
    finally:
        if other is not store:
            await other.aclose()
    cached = await live(store, "tools/call")
    assert len(cached) == 1 and all(ttl is not None and 0 < ttl <= 2 for ttl in cached.values())

    async def expired() -> bool:
        return not await live(store, "tools/call")

    await eventually(expired)
    assert await call(counting_server(store, ttl=2)) == 2


async def test_oauth_client_storage(backend: Backend, namespace: str, store: Any) -> None:
    adapter = feature("oauth-client-storage")
    from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
    from pydantic import AnyUrl

    info = OAuthClientInformationFull(
        client_id="client-1",
        client_secret="client-secret-text",
        client_secret_expires_at=int(time.time()) + 5,  # time to reopen the store on a loaded machine
        redirect_uris=[AnyUrl("http://127.0.0.1:9/callback")],
    )
    storage = adapter(store, server_url="https://mcp.example/mcp")
    await storage.set_client_info(info)
    await storage.set_tokens(OAuthToken(access_token="access-1", expires_in=3600, refresh_token="refresh-1"))
    other = await reopened(backend, namespace, store)
    try:
        again = adapter(other, server_url="https://mcp.example/mcp")
        assert await again.get_client_info() == info
        tokens = await again.get_tokens()
        assert tokens is not None and tokens.refresh_token == "refresh-1"
    finally:
        if other is not store:
            await other.aclose()

    async def expired() -> bool:
        return await storage.get_client_info() is None

    await eventually(expired, within=15)
