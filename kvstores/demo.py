"""``kvstores demo``: FastMCP session state on a kvstores store, step by step.

Runs a real FastMCP server (in-process, see :mod:`kvstores.harness`) on the
store at ``--store`` (default: an SQLite file in the working directory) and shows, in a
few seconds: handshake sessions kept apart and fresh on reconnect, ctx state expiring on
its TTL, and an explicit session surviving a server restart. Between phases the server
is restarted: the store is closed and opened again from its URL, and a new FastMCP is
built on it.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

from kvstores._optional import missing_extra
from kvstores.errors import KVStoreError
from kvstores.harness import FASTMCP_STATE_COLLECTION, connected_client, state_server
from kvstores.protocol import AsyncKeyValue
from kvstores.registry import open_store

try:
    from fastmcp import Client
    from fastmcp.exceptions import ToolError
    from key_value.aio.wrappers.ttl_clamp import TTLClampWrapper
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("fastmcp", "fastmcp") from exc

__all__ = ["DEFAULT_STORE", "main"]

DEFAULT_STORE = "sqlite:///kvstores-demo.db"
"""The store the demo uses unless given ``--store``: a file in the working directory."""

_EXPIRY_SECONDS = 1.0


class _Demo:
    """Prints each step and what it showed; counts the surprises."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.restarts = 0
        self.surprises = 0

    @asynccontextmanager
    async def server_store(self, title: str) -> AsyncIterator[Any]:
        """Open the store afresh for the next phase (a server restart after the first)."""
        if self.restarts:
            print("\n-- server restarted: store closed and opened again from its URL, new FastMCP --")
        self.restarts += 1
        print(f"\n[server {self.restarts}] {title}")
        async with open_store(self.url) as store:
            yield store

    def step(self, what: str) -> None:
        """Print one step."""
        print(f"  {what}")

    def check(self, ok: bool, shown: str) -> None:
        """Print what a step showed, flagged when it is not what a working store shows."""
        if not ok:
            self.surprises += 1
        print(f"    {'ok' if ok else 'UNEXPECTED'}: {shown}")


async def _call(client: Client[Any], tool: str, **arguments: Any) -> Any:
    return (await client.call_tool(tool, arguments)).data


async def _session(client: Client[Any]) -> str:
    return str((await _call(client, "list_session_info"))["session_id"])


async def _handshake_sessions(demo: _Demo) -> None:
    async with demo.server_store("handshake sessions: ctx.set_state / ctx.get_state (mode='legacy')") as store:
        server = state_server(store)
        async with Client(server, mode="legacy") as alice:
            demo.step(f"Alice connects: session {(await _session(alice))[:8]}")
            await _call(alice, "set_value", key="user", value="Alice")
            await _call(alice, "set_value", key="secret", value="alice-password")
            demo.step("Alice sets user='Alice', secret='alice-password'")
            user, secret = await _call(alice, "get_value", key="user"), await _call(alice, "get_value", key="secret")
            demo.step(f"Alice reads user -> {user!r}, secret -> {secret!r}")
            demo.check((user, secret) == ("Alice", "alice-password"), "state persists across calls in a session")
        async with Client(server, mode="legacy") as bob:
            demo.step(f"Bob connects: session {(await _session(bob))[:8]}")
            user, secret = await _call(bob, "get_value", key="user"), await _call(bob, "get_value", key="secret")
            demo.step(f"Bob reads user -> {user!r}, secret -> {secret!r}")
            demo.check((user, secret) == (None, None), "sessions are isolated: Bob sees none of Alice's state")
            await _call(bob, "set_value", key="user", value="Bob")
            user = await _call(bob, "get_value", key="user")
            demo.step(f"Bob sets user='Bob' and reads user -> {user!r}")
            demo.check(user == "Bob", "same key, different value per session")
        async with Client(server, mode="legacy") as alice_again:
            demo.step(f"Alice reconnects: session {(await _session(alice_again))[:8]}")
            user = await _call(alice_again, "get_value", key="user")
            demo.step(f"Alice reads user -> {user!r}")
            demo.check(user is None, "a reconnect starts a fresh session")


async def _expiry(demo: _Demo) -> None:
    async with demo.server_store("expiry: ctx state is written with a TTL") as store:
        async with connected_client(store) as client:
            session_id = await _session(client)
            await _call(client, "set_value", key="user", value="Alice")
            _, remaining = await store.ttl(f"{session_id}:user", collection=FASTMCP_STATE_COLLECTION)
            demo.step(f"set user='Alice'; the store reports it expires in {remaining or 0:,.0f} s")
            demo.check(remaining is not None and remaining > 86_000, "FastMCP's one-day TTL reached the store")
        capped: AsyncKeyValue = TTLClampWrapper(store, min_ttl=_EXPIRY_SECONDS, max_ttl=_EXPIRY_SECONDS)
        demo.step(f"cap the store's TTLs at {_EXPIRY_SECONDS:g} s (py-key-value's TTLClampWrapper) and reconnect")
        async with connected_client(capped) as client:
            await _call(client, "set_value", key="user", value="Alice")
            demo.step(f"set user='Alice'; read at once -> {await _call(client, 'get_value', key='user')!r}")
            await asyncio.sleep(_EXPIRY_SECONDS + 0.5)
            user = await _call(client, "get_value", key="user")
            demo.step(f"{_EXPIRY_SECONDS + 0.5:g} s later, read -> {user!r}")
            demo.check(user is None, "the state expired on its TTL")


async def _explicit_session(demo: _Demo) -> str:
    async with demo.server_store("explicit session: SessionProvider, session_id: SessionId (any mode)") as store:
        server = state_server(store)
        async with Client(server) as first:
            session_id: str = await _call(first, "create_session")
            await _call(first, "remember", session_id=session_id, key="user", value="Alice")
            demo.step(f"connection 1: create_session -> {session_id[:8]}..., remember user='Alice'")
        async with Client(server) as second:
            user = await _call(second, "recall", session_id=session_id, key="user")
            demo.step(f"connection 2: recall user -> {user!r}")
            demo.check(user == "Alice", "an explicit session is shared between connections")
    return session_id


async def _after_restart(demo: _Demo, session_id: str) -> None:
    persistent = not _in_process(demo.url)
    async with (
        demo.server_store("the explicit session after the restart") as store,
        connected_client(store, mode="auto") as client,
    ):
        found = await client.call_tool("recall", {"session_id": session_id, "key": "user"}, raise_on_error=False)
        shown = "unknown session" if found.is_error else repr(found.data)
        demo.step(f"recall user from session {session_id[:8]}... -> {shown}")
        if persistent:
            demo.check(found.data == "Alice", "the session survived the server restart")
            await _call(client, "end_session", session_id=session_id)
            demo.step("end_session: its state is deleted from the store")
        else:
            demo.check(found.is_error, f"{demo.url} keeps nothing once closed, so the session is gone")


def _in_process(url: str) -> bool:
    """True for stores that live only as long as the store object (memory, SQLite :memory:)."""
    return urlsplit(url).scheme == "memory" or ":memory:" in url


async def _run(url: str) -> int:
    demo = _Demo(url)
    print(f"kvstores demo: FastMCP session state on {url}")
    try:
        await _handshake_sessions(demo)
        await _expiry(demo)
        session_id = await _explicit_session(demo)
        await _after_restart(demo, session_id)
    except (KVStoreError, ToolError) as exc:
        print(f"\ndemo stopped: the store failed: {exc}")
        return 1
    print("\nall steps showed what they should" if not demo.surprises else f"\n{demo.surprises} unexpected result(s)")
    return 1 if demo.surprises else 0


def main(argv: list[str] | None = None) -> int:
    """Run the demo on ``--store URL``; return 0 when every step showed what it should."""
    parser = argparse.ArgumentParser(prog="kvstores demo", description="FastMCP session state, step by step.")
    parser.add_argument("--store", default=DEFAULT_STORE, help=f"kvstores URL (default: {DEFAULT_STORE})")
    options = parser.parse_args(argv)
    return asyncio.run(_run(options.store))
