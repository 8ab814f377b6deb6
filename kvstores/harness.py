"""A FastMCP server on a store and a client connected to it in one process, with no network.

The FastMCP counterpart of the MCP SDK's ``create_connected_server_and_client_session``:
``kvstores demo`` and :class:`kvstores.conformance.SessionStateConformance` run on it, and
so can your own code or tests (it needs the ``fastmcp`` extra, not pytest)::

    from kvstores.harness import connected_client

    async with connected_client(store) as client:
        await client.call_tool("set_value", {"key": "user", "value": "Alice"})
        assert (await client.call_tool("get_value", {"key": "user"})).data == "Alice"

Pass ``server_factory=`` to serve your own FastMCP built on the store; the default is
:func:`state_server`. For two clients of one server, build it once and open
``fastmcp.Client(server, mode="legacy")`` twice.

fastmcp 4 has two session modes:

- handshake (``mode="legacy"``): ``ctx.set_state``/``ctx.get_state`` are keyed by the
  connection's session id and written with a one-day TTL (:data:`FASTMCP_STATE_TTL`), so
  state lasts as long as the connection. (The default ``mode="auto"`` negotiates the
  stateless 2026-07-28 protocol, where the session id changes on every request and ctx
  state does not carry over.)
- explicit sessions (every mode): ``SessionProvider`` adds ``create_session``; tools take
  ``session_id: SessionId`` and ``await get_session(session_id)``. One entry per session,
  no TTL: on a persistent store it survives a server restart and is shared by every server
  using that store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from kvstores._optional import missing_extra
from kvstores.protocol import AsyncKeyValue

try:
    from fastmcp import Client, Context, FastMCP
    from fastmcp.client.transports import FastMCPTransport
    from fastmcp.server.dependencies import get_session
    from fastmcp.server.sessions import SessionId, SessionProvider
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("fastmcp", "fastmcp") from exc

__all__ = [
    "FASTMCP_STATE_COLLECTION",
    "FASTMCP_STATE_TTL",
    "ServerFactory",
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
