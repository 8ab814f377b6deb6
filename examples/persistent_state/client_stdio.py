"""Client for the persistent_state example, in-process (no network).

    python examples/persistent_state/client_stdio.py [--store URL]

Runs the same scenarios as client.py against server.py's FastMCP in this process, then
"restarts" the server — closes the store, opens it again from the same URL and builds a
new FastMCP on it — and reads the explicit session back.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from client import create_explicit_session, show_explicit_session, show_handshake_sessions
from fastmcp import Client
from server import DEFAULT_STORE, build_server

from kvstores import open_store


async def main() -> None:
    """Run the scenarios against an in-process server on --store."""
    parser = argparse.ArgumentParser(description="In-process client for the persistent_state example.")
    parser.add_argument("--store", default=DEFAULT_STORE, help=f"kvstores URL (default: {DEFAULT_STORE})")
    options = parser.parse_args()

    async with open_store(options.store) as store:
        server = build_server(store)

        def connect(mode: str = "auto") -> Client[Any]:
            return Client(server, mode=mode)

        await show_handshake_sessions(connect)
        session_id = await create_explicit_session(connect)

    print("\n(server restarted: store closed and opened again, new FastMCP)")
    async with open_store(options.store) as store:
        restarted = build_server(store)

        def reconnect(mode: str = "auto") -> Client[Any]:
            return Client(restarted, mode=mode)

        await show_explicit_session(reconnect, session_id, "after the server restarted")


if __name__ == "__main__":
    asyncio.run(main())
