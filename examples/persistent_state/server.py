"""Example: session state that lives in a kvstores store.

The tools mirror FastMCP's own persistent_state example (set_value, get_value,
list_session_info: handshake-mode state via ctx.set_state/get_state), plus the explicit
session API (create_session/end_session from SessionProvider, remember/recall taking
a ``session_id: SessionId``), which survives a server restart on a persistent store.

Run (streamable HTTP on http://127.0.0.1:8000/mcp):

    python examples/persistent_state/server.py [--store URL] [--host H] [--port P]

The default store is an SQLite file in the working directory; any kvstores URL works,
e.g. --store redis://127.0.0.1:6379/0 or --store mongodb://127.0.0.1:27017/kvstores.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from fastmcp import Context, FastMCP
from fastmcp.server.dependencies import get_session
from fastmcp.server.sessions import SessionId, SessionProvider

from kvstores import AsyncKeyValue, open_store

DEFAULT_STORE = "sqlite:///persistent_state.db"


def build_server(store: AsyncKeyValue) -> FastMCP[Any]:
    """The example server, keeping its session state in ``store``."""
    server: FastMCP[Any] = FastMCP("StateExample", session_state_store=store)
    server.add_provider(SessionProvider())  # adds the create_session and end_session tools

    @server.tool
    async def set_value(key: str, value: str, ctx: Context) -> str:
        """Store a value in session state."""
        await ctx.set_state(key, value)
        return f"Stored '{key}' = '{value}'"

    @server.tool
    async def get_value(key: str, ctx: Context) -> str:
        """Retrieve a value from session state."""
        value = await ctx.get_state(key)
        if value is None:
            return f"Key '{key}' not found"
        return f"'{key}' = '{value}'"

    @server.tool
    def list_session_info(ctx: Context) -> dict[str, Any]:
        """Get information about the current session."""
        return {"session_id": ctx.session_id, "transport": ctx.transport}

    @server.tool
    async def remember(session_id: SessionId, key: str, value: str) -> str:
        """Store a value in an explicit session (made by create_session)."""
        session = await get_session(session_id)
        await session.set(key, value)
        return f"Stored '{key}' = '{value}'"

    @server.tool
    async def recall(session_id: SessionId, key: str) -> str:
        """Retrieve a value from an explicit session."""
        session = await get_session(session_id)
        value = await session.get(key)
        if value is None:
            return f"Key '{key}' not found"
        return f"'{key}' = '{value}'"

    return server


async def serve(store_url: str, host: str, port: int) -> None:
    """Serve the example over streamable HTTP until interrupted, then close the store."""
    async with open_store(store_url) as store:
        server = build_server(store)
        await server.run_http_async(host=host, port=port, show_banner=False)


def main() -> None:
    """Parse the command line and serve."""
    parser = argparse.ArgumentParser(description="Serve the persistent_state example over streamable HTTP.")
    parser.add_argument("--store", default=DEFAULT_STORE, help=f"kvstores URL (default: {DEFAULT_STORE})")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    options = parser.parse_args()
    asyncio.run(serve(options.store, options.host, options.port))


if __name__ == "__main__":
    main()
