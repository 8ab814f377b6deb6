"""SessionStateConformance: a store behind ``FastMCP(session_state_store=...)``, as a pytest class.

Subclass it with a ``store`` fixture (and optionally ``peer_store``, a second store object
on the same namespace)::

    class TestMyStoreWithFastMCP(SessionStateConformance):
        @pytest.fixture
        async def store(self):
            async with MyStore(...) as store:
                yield store

The checks run a FastMCP server on the store with the in-process harness of
:mod:`kvstores.harness` (which needs no pytest: use it in your own code too), under both
of fastmcp 4's session modes: handshake sessions (``ctx.set_state``/``ctx.get_state``,
``mode="legacy"``) and explicit sessions (``SessionProvider``, ``SessionId``).

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
from contextlib import AsyncExitStack
from typing import Any, ClassVar

from kvstores._optional import missing_extra
from kvstores.conformance._base import StoreConformance
from kvstores.harness import FASTMCP_STATE_COLLECTION, FASTMCP_STATE_TTL, connected_client, state_server

try:
    from fastmcp import Client
    from key_value.aio.wrappers.ttl_clamp import TTLClampWrapper
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("fastmcp", "fastmcp") from exc

__all__ = ["SessionStateConformance"]


async def _call(client: Client[Any], tool: str, **arguments: Any) -> Any:
    return (await client.call_tool(tool, arguments)).data


async def _session_id(client: Client[Any]) -> str:
    info = await _call(client, "list_session_info")
    return str(info["session_id"])


class SessionStateConformance(StoreConformance):
    """A store plugged into FastMCP keeps session state right; subclass it with a ``store`` fixture.

    ``store`` must yield a store on an empty, isolated namespace; ``peer_store`` (optional)
    a second store object on the same namespace, to check that explicit sessions survive
    a restart and are shared between servers that open the store separately.
    """

    expiry_seconds: ClassVar[float] = 0.5
    """The capped TTL the expiry check gives ctx state."""
    ttl_tolerance: ClassVar[float] = 60.0
    """Seconds of slack allowed when checking the TTL FastMCP wrote."""
    concurrent_sessions: ClassVar[int] = 200
    """Sessions the concurrency check runs at once."""

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
        async with connected_client(store) as client:
            session_id = await _session_id(client)
            await _call(client, "set_value", key="user", value="Alice")
        value, remaining = await store.ttl(f"{session_id}:user", collection=FASTMCP_STATE_COLLECTION)
        assert value == {"value": "Alice"}
        assert remaining is not None
        assert FASTMCP_STATE_TTL - self.ttl_tolerance <= remaining <= FASTMCP_STATE_TTL

    async def test_ttl_ctx_state_expires(self, store: Any) -> None:
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
