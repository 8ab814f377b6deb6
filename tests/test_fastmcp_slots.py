"""FastMCP's other store slots on every backend of the table, through FastMCP's own code.

- ``OAuthProxy(client_storage=...)``: dynamic client registration, consent, the upstream
  callback and the token exchange over real HTTP (a fake IdP on loopback), with the store
  wrapped in py-key-value's FernetEncryptionWrapper as FastMCP's default is;
- the client's ``OAuth(token_storage=...)``: the same flow, seen from the client;
- ``ResponseCachingMiddleware(cache_storage=...)``;
- ``fastmcp.server.event_store.EventStore(storage=...)`` behind ``http_app(event_store=...)``.

Each shows that the state lives in the store: it is there in the raw store, a new server on a
new store object (a restart; not on memory, whose store objects share nothing) carries on
from it, and it expires on time.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from cryptography.fernet import Fernet
from fastmcp import Client, FastMCP
from fastmcp.client.auth.oauth import TokenStorageAdapter
from fastmcp.server.event_store import EventStore
from fastmcp.server.middleware.caching import CallToolSettings, ResponseCachingMiddleware
from key_value.aio.wrappers.encryption import FernetEncryptionWrapper
from mcp.server.streamable_http import EventMessage
from mcp.shared.auth import OAuthClientInformationFull
from pydantic import AnyUrl

from tests.support import Backend
from tests.support.events import expected_notes, fastmcp_server, run_long_task, serving
from tests.support.fastmcp_slots import BrowserOAuth, FakeIdP, Loopback, oauth_proxy, protected_server

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

OAUTH_COLLECTIONS = ("mcp-oauth-proxy-clients", "mcp-upstream-tokens", "mcp-jti-mappings", "mcp-refresh-tokens")
"""Where OAuthProxy keeps registered clients and tokens."""

CLIENT_COLLECTIONS = ("mcp-oauth-token", "mcp-oauth-client-info")
"""Where the client's OAuth keeps its tokens and its registration."""


async def raw_entries(store: Any) -> dict[tuple[str, str], tuple[dict[str, Any] | None, float | None]]:
    """Every live entry of a kvstores store: (collection, key) -> (value, remaining TTL)."""
    entries = {}
    for collection in await store.collections():
        keys = await store.keys(collection)
        for key, found in zip(keys, await store.ttl_many(keys, collection=collection)):
            entries[collection, key] = found
    return entries


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    """Poll ``check`` until it holds; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.1)


async def test_an_empty_store_is_truthy(store: Any) -> None:
    """FastMCP picks its default with ``storage or MemoryStore()``: an empty store must not be falsy."""
    assert bool(store)


@pytest.fixture
async def client_store(backend: Backend, namespace: str) -> AsyncIterator[Any]:
    """A store for the MCP client's side, on a namespace of its own, destroyed afterwards."""
    opened = await backend.open(f"{namespace}c")
    yield opened
    await opened.destroy()
    await opened.aclose()


@pytest.fixture
def fernet_key() -> bytes:
    return Fernet.generate_key()


def encrypted(store: Any, key: bytes) -> FernetEncryptionWrapper:
    """``store`` encrypted at rest the way FastMCP's default OAuth storage is."""
    return FernetEncryptionWrapper(key_value=store, fernet=Fernet(key))


# -- OAuthProxy(client_storage=...) and OAuth(token_storage=...) ---------------------------------


class OAuthRun:
    """An IdP, a loopback port for the MCP server, and the client's OAuth on that server."""

    def __init__(self, idp: FakeIdP) -> None:
        self.idp = idp
        self.mcp = Loopback()
        self.idp_port = Loopback()
        self.url = f"{self.mcp.base_url}/mcp"

    async def call_whoami(self, server_store: Any, oauth: BrowserOAuth) -> str:
        """Serve an OAuthProxy server on ``server_store``; call ``whoami`` with ``oauth``."""
        async with self.idp_port.serving(self.idp.app()) as idp_url:
            auth = oauth_proxy(self.mcp.base_url, idp_url, self.idp, server_store)
            app = protected_server(auth).http_app(path="/mcp")
            async with self.mcp.serving(app), Client(self.url, auth=oauth) as client:
                result = await client.call_tool("whoami", {})
        answer: str = result.data
        return answer


async def test_oauth_flow_keeps_clients_and_tokens_encrypted_in_the_store(
    store: Any, client_store: Any, fernet_key: bytes
) -> None:
    idp = FakeIdP()
    run = OAuthRun(idp)
    oauth = BrowserOAuth(run.url, token_storage=encrypted(client_store, fernet_key))

    assert await run.call_whoami(encrypted(store, fernet_key), oauth) == "an authenticated client"

    assert oauth.authorizations == 1
    server_side = await raw_entries(store)
    assert {collection for collection, _ in server_side} >= set(OAUTH_COLLECTIONS)
    client_side = await raw_entries(client_store)
    assert {collection for collection, _ in client_side} >= set(CLIENT_COLLECTIONS)
    tokens = await oauth.token_storage_adapter.get_tokens()
    assert tokens is not None and tokens.refresh_token is not None
    secrets = [*idp.secrets_issued(), tokens.access_token, tokens.refresh_token]
    for (collection, key), (value, _) in {**server_side, **client_side}.items():
        assert value is not None and set(value) == {"__encrypted_data__", "__encryption_version__"}, collection
        stored = key + json.dumps(value)
        assert not any(secret in stored for secret in secrets), (collection, key)
    # one registered client on each side, under the id the server gave it
    registered = [key for collection, key in server_side if collection == "mcp-oauth-proxy-clients"]
    client_info = await oauth.token_storage_adapter.get_client_info()
    assert client_info is not None and registered == [client_info.client_id]
    assert server_side["mcp-oauth-proxy-clients", registered[0]][1] is None  # registrations do not expire


async def test_oauth_state_survives_a_restart_on_a_new_store_object(
    backend: Backend, namespace: str, store: Any, client_store: Any, fernet_key: bytes
) -> None:
    if not backend.persistent:
        pytest.skip(f"{backend.name}: each store object has its own data, so nothing survives a restart")
    run = OAuthRun(FakeIdP())
    first = BrowserOAuth(run.url, token_storage=encrypted(client_store, fernet_key))
    assert await run.call_whoami(encrypted(store, fernet_key), first) == "an authenticated client"
    assert first.authorizations == 1

    # both sides restart: new server, new OAuthProxy, new client, new store objects
    server_store = await backend.open(namespace)
    client_again = await backend.open(f"{namespace}c")
    try:
        second = BrowserOAuth(run.url, token_storage=encrypted(client_again, fernet_key))
        assert await run.call_whoami(encrypted(server_store, fernet_key), second) == "an authenticated client"
    finally:
        await server_store.aclose()
        await client_again.aclose()
    assert second.authorizations == 0  # the stored tokens were accepted: no new browser flow


async def test_oauth_tokens_expire_from_the_store_on_time(store: Any, client_store: Any, fernet_key: bytes) -> None:
    idp = FakeIdP(expires_in=2, refresh=False)
    run = OAuthRun(idp)
    oauth = BrowserOAuth(run.url, token_storage=encrypted(client_store, fernet_key))
    assert await run.call_whoami(encrypted(store, fernet_key), oauth) == "an authenticated client"

    token_collections = ("mcp-upstream-tokens", "mcp-jti-mappings")
    entries = await raw_entries(store)
    ttls = [ttl for (collection, _), (_, ttl) in entries.items() if collection in token_collections]
    assert len(ttls) == 2 and all(ttl is not None and 0 < ttl <= 2 for ttl in ttls), entries

    async def tokens_gone() -> bool:
        return not any(collection in token_collections for collection, _ in await raw_entries(store))

    await eventually(tokens_gone, within=6)
    assert any(collection == "mcp-oauth-proxy-clients" for collection, _ in await raw_entries(store))


async def test_client_token_storage_persists_and_expires(
    backend: Backend, namespace: str, client_store: Any, fernet_key: bytes
) -> None:
    """FastMCP's client-side adapter: the registration expires with its client secret."""
    adapter = TokenStorageAdapter(encrypted(client_store, fernet_key), server_url="https://mcp.example/mcp")
    info = OAuthClientInformationFull(
        client_id="client-1",
        client_secret="client-secret-text",
        client_secret_expires_at=int(time.time()) + 2,
        redirect_uris=[AnyUrl("http://127.0.0.1:9/callback")],
    )
    await adapter.set_client_info(info)
    assert (await adapter.get_client_info()) == info
    raw = await raw_entries(client_store)
    assert raw and "client-secret-text" not in repr(raw)

    if backend.persistent:
        other = await backend.open(f"{namespace}c")
        try:
            again = TokenStorageAdapter(encrypted(other, fernet_key), server_url="https://mcp.example/mcp")
            assert (await again.get_client_info()) == info
        finally:
            await other.aclose()

    async def expired() -> bool:
        return await adapter.get_client_info() is None and not await raw_entries(client_store)

    await eventually(expired, within=6)


# -- ResponseCachingMiddleware(cache_storage=...) -----------------------------------------------


class CountingServer:
    """A FastMCP server whose ``count`` tool answers how often it has run, behind the caching middleware."""

    def __init__(self, cache_storage: Any, ttl: int) -> None:
        self.runs = 0
        self.server: FastMCP[Any] = FastMCP("caching-slot")
        settings: CallToolSettings = {"ttl": ttl}
        self.server.add_middleware(ResponseCachingMiddleware(cache_storage=cache_storage, call_tool_settings=settings))

        @self.server.tool
        def count(label: str) -> int:
            """Run once per call that misses the cache."""
            self.runs += 1
            return self.runs

    async def call(self, label: str = "a") -> int:
        """Call ``count`` in-process."""
        async with Client(self.server) as client:
            answer: int = (await client.call_tool("count", {"label": label})).data
        return answer


async def test_response_cache_lives_in_the_store_and_expires(store: Any) -> None:
    server = CountingServer(store, ttl=3)  # long enough for three calls on a loaded machine
    assert [await server.call(), await server.call(), await server.call("b")] == [1, 1, 2]
    cached = {
        key: ttl for (collection, key), (_, ttl) in (await raw_entries(store)).items() if collection == "tools/call"
    }
    assert len(cached) == 2 and all(ttl is not None and 0 < ttl <= 3 for ttl in cached.values())

    async def expired() -> bool:
        return not any(collection == "tools/call" for collection, _ in await raw_entries(store))

    await eventually(expired, within=10)
    assert await server.call() == 3  # a miss again: the tool runs


async def test_response_cache_survives_a_restart_on_a_new_store_object(
    backend: Backend, namespace: str, store: Any
) -> None:
    if not backend.persistent:
        pytest.skip(f"{backend.name}: each store object has its own data, so nothing survives a restart")
    assert await CountingServer(store, ttl=60).call() == 1
    other = await backend.open(namespace)
    try:
        restarted = CountingServer(other, ttl=60)
        assert await restarted.call() == 1  # served from the store
        assert restarted.runs == 0
    finally:
        await other.aclose()


# -- fastmcp.server.event_store.EventStore(storage=...) -----------------------------------------


RESUME_MS = 3000
"""retry_interval for FastMCP's EventStore: the client comes back once the long task is done."""


class RecordingEventStore(EventStore):
    """FastMCP's EventStore that remembers the ids it handed out, in order.

    With it the test steers clear of the SDK's own window between replay and live tail (mcp's
    streamable_http: "the replay→live-tail ordering window here is pre-existing"): an event being
    stored while the client comes back is neither on the list the replay reads nor sent live,
    since the resumed stream is not registered yet. A store slower than the client's reconnect
    (SecantusDB on a loaded machine) hit it. So the client comes back after RESUME_MS, when the
    task is done, and a replay first waits until no event has been stored for 0.1 s: the whole
    tail then comes from the store. (kvstores.events closes that window for its own event store.)
    """

    def __init__(self, storage: Any, ttl: int | None) -> None:
        super().__init__(storage=storage, ttl=ttl)
        self.ids: list[str] = []
        self._storing = 0
        self._started = 0

    async def store_event(self, stream_id: str, message: Any) -> str:
        self._storing += 1
        self._started += 1
        try:
            event_id = await super().store_event(stream_id, message)
        finally:
            self._storing -= 1
        self.ids.append(event_id)
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: Any) -> str | None:
        async with asyncio.timeout(30):
            while True:
                started = self._started
                await asyncio.sleep(0.1)
                if self._storing == 0 and self._started == started:
                    break
        return await super().replay_events_after(last_event_id, send_callback)


async def test_event_store_resumes_from_the_store_and_a_new_store_object_replays(
    backend: Backend, namespace: str, store: Any
) -> None:
    events = RecordingEventStore(store, ttl=60)
    async with serving(fastmcp_server().http_app(event_store=events, retry_interval=RESUME_MS)) as url:
        assert (await run_long_task(url))[0] == expected_notes()
    stored = await raw_entries(store)
    # every event handed out is stored (a priming event whose store_event did not return may be too)
    assert set(events.ids) <= {key for collection, key in stored if collection == "fastmcp_events"}
    assert all(ttl is not None and 0 < ttl <= 60 for _, ttl in stored.values())
    if not backend.persistent:
        return

    other = await backend.open(namespace)
    try:
        replayed: list[EventMessage] = []

        async def collect(event: EventMessage) -> None:
            replayed.append(event)

        assert await EventStore(storage=other).replay_events_after(events.ids[0], collect) is not None
    finally:
        await other.aclose()
    assert replayed and all(event.event_id in events.ids[1:] for event in replayed)


async def test_event_store_entries_expire_on_time(store: Any) -> None:
    events = RecordingEventStore(store, ttl=3)  # outlives the call and the read on a loaded machine
    async with serving(fastmcp_server().http_app(event_store=events)) as url, Client(url, mode="legacy") as client:
        assert (await client.call_tool("echo", {"text": "hi"})).data == "hi"
    assert events.ids
    stored = await raw_entries(store)
    assert {collection for collection, _ in stored} == {"fastmcp_events", "fastmcp_streams"}
    assert all(ttl is not None and 0 < ttl <= 3 for _, ttl in stored.values())

    async def expired() -> bool:
        return not await raw_entries(store)

    await eventually(expired, within=10)

    async def never(event: EventMessage) -> None:
        raise AssertionError("an expired event was replayed")

    assert await events.replay_events_after(events.ids[0], never) is None
