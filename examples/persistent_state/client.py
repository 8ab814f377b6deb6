"""Client for the persistent_state example, over streamable HTTP.

Against a server you started (python server.py [--store URL]):

    python examples/persistent_state/client.py [--url http://127.0.0.1:8000/mcp]

It shows handshake sessions (Alice sets `user` and `secret`; Bob, a new session, sees
neither; Alice reconnecting gets a fresh session), then creates an explicit session
and prints its id. Restart the server and read that session back:

    python examples/persistent_state/client.py --session ID

Or let the client run server.py itself on a store, and restart it halfway:

    python examples/persistent_state/client.py --store sqlite:///persistent_state.db
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastmcp import Client

DEFAULT_URL = "http://127.0.0.1:8000/mcp"
SERVER = Path(__file__).with_name("server.py")

Connect = Callable[..., Client[Any]]
"""Opens a new connection to the server: ``connect(mode="legacy")``."""


async def call(client: Client[Any], tool: str, **arguments: Any) -> Any:
    """Call ``tool`` and return its result."""
    return (await client.call_tool(tool, arguments)).data


async def show_handshake_sessions(connect: Connect) -> None:
    """Alice and Bob on handshake (legacy) sessions, where ctx state lasts a connection."""
    print("Each line below is a separate tool call\n")
    print("Alice connects")
    async with connect(mode="legacy") as alice:
        print(f"  session {(await call(alice, 'list_session_info'))['session_id'][:8]}")
        print(f"  set user -> {await call(alice, 'set_value', key='user', value='Alice')}")
        print(f"  set secret -> {await call(alice, 'set_value', key='secret', value='alice-password')}")
        print(f"  get user -> {await call(alice, 'get_value', key='user')}")
        print(f"  get secret -> {await call(alice, 'get_value', key='secret')}")
    print("\nBob connects (different session)")
    async with connect(mode="legacy") as bob:
        print(f"  session {(await call(bob, 'list_session_info'))['session_id'][:8]}")
        print(f"  get user -> {await call(bob, 'get_value', key='user')}")
        print(f"  get secret -> {await call(bob, 'get_value', key='secret')}")
        print(f"  set user -> {await call(bob, 'set_value', key='user', value='Bob')}")
        print(f"  get user -> {await call(bob, 'get_value', key='user')}")
    print("\nAlice reconnects (new session)")
    async with connect(mode="legacy") as alice_again:
        print(f"  session {(await call(alice_again, 'list_session_info'))['session_id'][:8]}")
        print(f"  get user -> {await call(alice_again, 'get_value', key='user')}")


async def create_explicit_session(connect: Connect) -> str:
    """Create an explicit session through one connection and read it through another."""
    print("\nExplicit session (SessionProvider), any protocol mode")
    async with connect() as first:
        session_id: str = await call(first, "create_session")
        print(f"  connection 1: create_session -> {session_id}")
        stored = await call(first, "remember", session_id=session_id, key="user", value="Alice")
        print(f"  connection 1: remember user -> {stored}")
    async with connect() as second:
        print(f"  connection 2: recall user -> {await call(second, 'recall', session_id=session_id, key='user')}")
    return session_id


async def show_explicit_session(connect: Connect, session_id: str, where: str) -> None:
    """Read an explicit session back, e.g. after a server restart."""
    print(f"\nExplicit session {session_id[:8]}, {where}")
    async with connect() as client:
        print(f"  recall user -> {await call(client, 'recall', session_id=session_id, key='user')}")


def http_connect(url: str) -> Connect:
    """Connections to the server at ``url`` over streamable HTTP."""
    return lambda mode="auto": Client(url, mode=mode)


@asynccontextmanager
async def running_server(store_url: str) -> AsyncIterator[str]:
    """Run server.py on ``store_url`` in a child process; yield its MCP URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SERVER),
        "--store",
        store_url,
        "--port",
        str(port),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        for _ in range(300):
            if process.returncode is not None:
                raise RuntimeError(f"server.py exited with {process.returncode}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.1)
            else:
                writer.close()
                break
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        await process.wait()


async def main() -> None:
    """Run the scenarios chosen on the command line."""
    parser = argparse.ArgumentParser(description="Client for the persistent_state example (streamable HTTP).")
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the running server (default: {DEFAULT_URL})")
    parser.add_argument("--session", help="only read back this explicit session (e.g. after a restart)")
    parser.add_argument("--store", help="run server.py on this kvstores URL yourself, restarting it halfway")
    options = parser.parse_args()
    if options.store:
        async with running_server(options.store) as url:
            await show_handshake_sessions(http_connect(url))
            session_id = await create_explicit_session(http_connect(url))
        print("\n(server restarted)")
        async with running_server(options.store) as url:
            await show_explicit_session(http_connect(url), session_id, "after the server restarted")
    elif options.session:
        await show_explicit_session(http_connect(options.url), options.session, "read back")
    else:
        await show_handshake_sessions(http_connect(options.url))
        session_id = await create_explicit_session(http_connect(options.url))
        print(f"\nRestart the server, then run: python {sys.argv[0]} --session {session_id}")


if __name__ == "__main__":
    asyncio.run(main())
