"""FastMCP session state on a store: the in-memory harness and SessionStateConformance.

The harness runs a FastMCP server on a store and a connected fastmcp client in one
process, with no network (the FastMCP counterpart of the MCP SDK's
``create_connected_server_and_client_session``). Use it in your own tests::

    from kvstores.conformance.fastmcp import connected_client

    async def test_state_outlives_a_call(store):
        async with connected_client(store) as client:
            await client.call_tool("set_value", {"key": "user", "value": "Alice"})
            assert (await client.call_tool("get_value", {"key": "user"})).data == "Alice"

Pass ``server_factory=`` to serve your own FastMCP built on the store; the default is
:func:`state_server`. For two clients of one server, build it once and open
``fastmcp.Client(server, mode="legacy")`` twice.

fastmcp 4 has two session modes, and the suite checks the store under both:

- handshake (``mode="legacy"``): ``ctx.set_state``/``ctx.get_state`` are keyed by the
  connection's session id and written with a one-day TTL, so state lasts as long as
  the connection. (The default ``mode="auto"`` negotiates the stateless 2026-07-28
  protocol, where the session id changes on every request and ctx state does not
  carry over.)
- explicit sessions (every mode): ``SessionProvider`` adds ``create_session``; tools
  take ``session_id: SessionId`` and ``await get_session(session_id)``. One entry per
  session, no TTL: on a persistent store it survives a server restart and is shared
  by every server using that store.

Expiry. FastMCP writes ctx state with a fixed TTL (``Context._STATE_TTL_SECONDS``,
86,400 s) and offers no setting to change it. Without patching fastmcp, the suite
checks expiry twice: the entry FastMCP wrote must report about one day through the
store's ``ttl()``; and a server whose store is wrapped in py-key-value's
``TTLClampWrapper`` (FastMCP leaves retention to the store, so capping it there is
the supported way to shorten it) must lose the state once the capped TTL passes.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, ClassVar

import pytest
from fastmcp import Client, Context, FastMCP
from fastmcp.client.transports import FastMCPTransport
from fastmcp.server.dependencies import get_session
from fastmcp.server.sessions import SessionId, SessionProvider
from key_value.aio.wrappers.ttl_clamp import TTLClampWrapper

from kvstores.protocol import AsyncKeyValue

__all__ = [
    "FASTMCP_STATE_COLLECTION",
    "FASTMCP_STATE_TTL",
    "ServerFactory",
    "SessionStateConformance",
    "connected_client",
    "state_server",
]

FASTMCP_STATE_COLLECTION = "fastmcp_state"
"""The collection FastMCP keeps session state in."""

FASTMCP_STATE_TTL = 86_400.0
"""The TTL, in seconds, FastMCP gives every ``ctx.set_state`` entry."""

ServerFactory = Callable[[AsyncKeyValue], FastMCP[Any]]
"""Builds a FastMCP server whose ``session_state_store`` is the given store."""


def state_server(store: AsyncKeyValue, *, name: str = "kvstores-state") -> FastMCP[Any]:
    """A FastMCP server on ``store`` with tools that read and write session state.

    Handshake-mode tools: ``set_value(key, value)``, ``get_value(key)`` (None when
    unset) and ``list_session_info()``. Explicit sessions: ``create_session()`` and
    ``end_session(session_id)`` from SessionProvider, ``remember(session_id, key,
    value)`` and ``recall(session_id, key)``. ``ping()`` touches no state.
    """
    server: FastMCP[Any] = FastMCP(name, session_state_store=store)
    server.add_provider(SessionProvider())

    @server.tool
    async def set_value(key: str, value: Any, ctx: Context) -> object:
        """Store a value in this connection's session state."""
        await ctx.set_state(key, value)
        return value

    @server.tool
    async def get_value(key: str, ctx: Context) -> object:
        """Read a value from this connection's session state (None when unset)."""
        return await ctx.get_state(key)

    @server.tool
    def list_session_info(ctx: Context) -> dict[str, str]:
        """The id ctx state is keyed by."""
        return {"session_id": ctx.session_id}

    @server.tool
    async def remember(session_id: SessionId, key: str, value: Any) -> object:
        """Store a value in an explicit session made by create_session."""
        session = await get_session(session_id)
        await session.set(key, value)
        return value

    @server.tool
    async def recall(session_id: SessionId, key: str) -> object:
        """Read a value from an explicit session (None when unset)."""
        session = await get_session(session_id)
        return await session.get(key)

    @server.tool
    def ping() -> str:
        """Answer without touching session state."""
        return "pong"

    return server


@asynccontextmanager
async def connected_client(
    store: AsyncKeyValue,
    *,
    server_factory: ServerFactory | None = None,
    mode: str = "legacy",
) -> AsyncIterator[Client[FastMCPTransport]]:
    """Yield a fastmcp Client connected in-process to a FastMCP server built on ``store``.

    ``server_factory`` defaults to :func:`state_server`; ``mode`` is the client's
    protocol mode ("legacy": handshake sessions, where ctx state persists; "auto").
    """
    server = (server_factory or state_server)(store)
    async with Client(server, mode=mode) as client:
        yield client


async def _call(client: Client[Any], tool: str, **arguments: Any) -> Any:
    return (await client.call_tool(tool, arguments)).data


async def _session_id(client: Client[Any]) -> str:
    info = await _call(client, "list_session_info")
    return str(info["session_id"])


class SessionStateConformance:
    """A store plugged into FastMCP keeps session state right; subclass it with a ``store`` fixture.

    ``store`` must yield a store on an empty, isolated namespace; ``peer_store`` (optional)
    a second store object on the same namespace, to check that explicit sessions survive
    a restart and are shared between servers that open the store separately.
    """

    pytestmark: ClassVar = [pytest.mark.anyio]

    supports_ttl: ClassVar[bool] = True
    """The store honours TTLs (switch off the ``test_ttl_`` group when False)."""
    expiry_seconds: ClassVar[float] = 0.5
    """The capped TTL the expiry check gives ctx state."""
    ttl_tolerance: ClassVar[float] = 60.0
    """Seconds of slack allowed when checking the TTL FastMCP wrote."""
    concurrent_sessions: ClassVar[int] = 200
    """Sessions the concurrency check runs at once."""

    @pytest.fixture
    def anyio_backend(self) -> str:
        """Run the suite on asyncio."""
        return "asyncio"

    @pytest.fixture
    async def store(self) -> AsyncIterator[Any]:
        """The store under test, on an empty namespace: override this fixture."""
        raise NotImplementedError("define a `store` fixture in your SessionStateConformance subclass")
        yield  # pragma: no cover

    @pytest.fixture
    async def peer_store(self) -> AsyncIterator[Any]:
        """A second store object on the same namespace as ``store``: override to enable."""
        pytest.skip("no peer_store fixture: restart and sharing across store objects not checked")
        yield  # pragma: no cover

    def _needs_ttl(self) -> None:
        if not self.supports_ttl:
            pytest.skip(f"{type(self).__name__}.supports_ttl is False")

    # -- handshake sessions: ctx.set_state / ctx.get_state ----------------------------

    async def test_sessions_isolated(self, store: Any) -> None:
        server = state_server(store)
        async with Client(server, mode="legacy") as alice, Client(server, mode="legacy") as bob:
            assert await _session_id(alice) != await _session_id(bob)
            await _call(alice, "set_value", key="user", value="Alice")
            await _call(alice, "set_value", key="secret", value="alice-password")
            assert await _call(bob, "get_value", key="user") is None
            await _call(bob, "set_value", key="user", value="Bob")
            assert await _call(alice, "get_value", key="user") == "Alice"
            assert await _call(bob, "get_value", key="user") == "Bob"
            assert await _call(bob, "get_value", key="secret") is None

    async def test_sessions_persist_across_calls(self, store: Any) -> None:
        nested = {"list": [1, "two", None, True, 2.5], "unicode": "caf\u00e9 \U0001f600", "big": 2**70}
        async with connected_client(store) as client:
            await _call(client, "set_value", key="user", value="Alice")
            await _call(client, "set_value", key="profile", value=nested)
            assert await _call(client, "get_value", key="user") == "Alice"
            await _call(client, "set_value", key="user", value="Alice B.")
            assert await _call(client, "get_value", key="user") == "Alice B."
            assert await _call(client, "get_value", key="profile") == nested

    async def test_sessions_reconnect_starts_fresh(self, store: Any) -> None:
        server = state_server(store)
        async with Client(server, mode="legacy") as first:
            first_id = await _session_id(first)
            await _call(first, "set_value", key="user", value="Alice")
        async with Client(server, mode="legacy") as again:
            assert await _session_id(again) != first_id
            assert await _call(again, "get_value", key="user") is None

    async def test_sessions_state_lives_in_the_store(self, store: Any) -> None:
        async with connected_client(store) as client:
            session_id = await _session_id(client)
            await _call(client, "set_value", key="user", value="Alice")
        stored = await store.get(f"{session_id}:user", collection=FASTMCP_STATE_COLLECTION)
        assert stored == {"value": "Alice"}

    # -- TTL ---------------------------------------------------------------------------

    async def test_ttl_ctx_state_written_with_fastmcp_ttl(self, store: Any) -> None:
        self._needs_ttl()
        async with connected_client(store) as client:
            session_id = await _session_id(client)
            await _call(client, "set_value", key="user", value="Alice")
        value, remaining = await store.ttl(f"{session_id}:user", collection=FASTMCP_STATE_COLLECTION)
        assert value == {"value": "Alice"}
        assert remaining is not None
        assert FASTMCP_STATE_TTL - self.ttl_tolerance <= remaining <= FASTMCP_STATE_TTL

    async def test_ttl_ctx_state_expires(self, store: Any) -> None:
        self._needs_ttl()
        capped = TTLClampWrapper(store, min_ttl=self.expiry_seconds, max_ttl=self.expiry_seconds)
        async with connected_client(capped) as client:
            session_id = await _session_id(client)
            await _call(client, "set_value", key="user", value="Alice")
            assert await _call(client, "get_value", key="user") == "Alice"
            await asyncio.sleep(self.expiry_seconds + 0.3)
            assert await _call(client, "get_value", key="user") is None
        assert await store.ttl(f"{session_id}:user", collection=FASTMCP_STATE_COLLECTION) == (None, None)

    # -- explicit sessions: SessionProvider / SessionId / get_session -------------------

    async def test_explicit_session_across_connections(self, store: Any) -> None:
        server = state_server(store)
        async with Client(server) as first:
            session_id = await _call(first, "create_session")
            await _call(first, "remember", session_id=session_id, key="user", value="Alice")
        async with Client(server) as second:
            assert await _call(second, "recall", session_id=session_id, key="user") == "Alice"
            assert await _call(second, "recall", session_id=session_id, key="secret") is None

    async def test_explicit_session_survives_restart(self, store: Any) -> None:
        async with connected_client(store, mode="auto") as before:
            session_id = await _call(before, "create_session")
            await _call(before, "remember", session_id=session_id, key="user", value="Alice")
        async with connected_client(store, mode="auto") as after:
            assert await _call(after, "recall", session_id=session_id, key="user") == "Alice"

    async def test_explicit_session_survives_restart_on_a_new_store_object(self, store: Any, peer_store: Any) -> None:
        async with connected_client(store, mode="auto") as before:
            session_id = await _call(before, "create_session")
            await _call(before, "remember", session_id=session_id, key="user", value="Alice")
        async with connected_client(peer_store, mode="auto") as after:
            assert await _call(after, "recall", session_id=session_id, key="user") == "Alice"

    async def test_explicit_session_shared_between_servers(self, store: Any) -> None:
        await self._check_shared(store, store)

    async def test_explicit_session_shared_between_store_objects(self, store: Any, peer_store: Any) -> None:
        await self._check_shared(store, peer_store)

    async def _check_shared(self, store_a: Any, store_b: Any) -> None:
        async with connected_client(store_a, mode="auto") as a, connected_client(store_b, mode="auto") as b:
            session_id = await _call(a, "create_session")
            await _call(a, "remember", session_id=session_id, key="user", value="Alice")
            assert await _call(b, "recall", session_id=session_id, key="user") == "Alice"
            await _call(b, "remember", session_id=session_id, key="user", value="Alice (via B)")
            assert await _call(a, "recall", session_id=session_id, key="user") == "Alice (via B)"

    async def test_explicit_session_unknown_or_ended_is_rejected(self, store: Any) -> None:
        async with connected_client(store, mode="auto") as client:
            unknown_id = str(uuid.uuid4())
            unknown = await client.call_tool("recall", {"session_id": unknown_id, "key": "user"}, raise_on_error=False)
            assert unknown.is_error
            session_id = await _call(client, "create_session")
            await _call(client, "remember", session_id=session_id, key="user", value="Alice")
            await _call(client, "end_session", session_id=session_id)
            ended = await client.call_tool("recall", {"session_id": session_id, "key": "user"}, raise_on_error=False)
            assert ended.is_error

    # -- concurrency -------------------------------------------------------------------

    async def test_concurrency_sessions_no_cross_talk(self, store: Any) -> None:
        server = state_server(store)
        async with AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(Client(server, mode="legacy")) for _ in range(self.concurrent_sessions)
            ]
            await asyncio.gather(
                *(_call(client, "set_value", key="user", value=f"user-{n}") for n, client in enumerate(clients))
            )
            seen = await asyncio.gather(*(_call(client, "get_value", key="user") for client in clients))
        assert seen == [f"user-{n}" for n in range(len(clients))]
