"""FastMCP session state over real HTTP between processes, and through a backend outage."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastmcp import Client
from mcp.shared.exceptions import MCPError

from kvstores import open_store
from kvstores.backends.sqlite import SQLiteStore
from kvstores.harness import connected_client
from tests.support.examples import example_servers
from tests.support.fixtures import skip_or_fail
from tests.support.redis import REDIS_URL, RedisServer, own_redis

pytestmark = pytest.mark.anyio


async def call(url: str, tool: str, **arguments: Any) -> Any:
    """One tool call on a new connection to the server at ``url``."""
    async with Client(url) as client:
        return (await client.call_tool(tool, arguments)).data


def error_text(result: Any) -> str:
    """The text of a tool's error result."""
    assert result.is_error
    return " ".join(getattr(block, "text", "") for block in result.content)


async def check_session_shared(url_a: str, url_b: str) -> None:
    """A session created through process A is read and updated through B, and A sees the update."""
    session_id = await call(url_a, "create_session")
    await call(url_a, "remember", session_id=session_id, key="user", value="Alice")
    assert await call(url_b, "recall", session_id=session_id, key="user") == "'user' = 'Alice'"
    await call(url_b, "remember", session_id=session_id, key="user", value="Alice, via B")
    assert await call(url_a, "recall", session_id=session_id, key="user") == "'user' = 'Alice, via B'"


async def test_two_processes_share_a_session_on_one_sqlite_file(tmp_path: Path) -> None:
    with example_servers(f"sqlite:///{tmp_path / 'shared.db'}", 2, tmp_path) as (url_a, url_b):
        await check_session_shared(url_a, url_b)


@pytest.fixture
async def shared_redis_url() -> AsyncIterator[str]:
    """The machine's Redis (db 15) under a prefix of its own, emptied afterwards."""
    try:
        with redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2) as client:
            client.ping()
    except redis.RedisError as exc:
        skip_or_fail("redis", f"no Redis at {REDIS_URL}: {exc}")
    url = f"{REDIS_URL}?prefix=t{uuid.uuid4().hex[:12]}"
    yield url
    async with open_store(url) as store:
        await store.destroy()


async def test_two_processes_share_a_session_on_one_redis(tmp_path: Path, shared_redis_url: str) -> None:
    with example_servers(shared_redis_url, 2, tmp_path) as (url_a, url_b):
        await check_session_shared(url_a, url_b)


async def test_sqlite_outage_fails_state_tools_only_and_recovers(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with SQLiteStore(path, timeout=0.3) as store, connected_client(store) as client:
        await client.call_tool("set_value", {"key": "user", "value": "Alice"})
        blocker = sqlite3.connect(path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock: no writes get through
            failed = await client.call_tool("set_value", {"key": "user", "value": "Bob"}, raise_on_error=False)
            assert "SQLite: database is locked" in error_text(failed)
            assert (await client.call_tool("ping", {})).data == "pong"
            assert (await client.call_tool("get_value", {"key": "user"})).data == "Alice"
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        await client.call_tool("set_value", {"key": "user", "value": "Bob"})
        assert (await client.call_tool("get_value", {"key": "user"})).data == "Bob"


@pytest.fixture
def own_redis_aof(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server this test may stop and start, with an append-only file so a restart keeps its data."""
    with own_redis(tmp_path, "--appendonly", "yes") as server:
        yield server


async def test_redis_outage_over_http_fails_state_tools_only_and_recovers(
    tmp_path: Path, own_redis_aof: RedisServer
) -> None:
    with example_servers(f"redis://127.0.0.1:{own_redis_aof.port}/0?timeout=1", 1, tmp_path) as (url,):
        session_id = await call(url, "create_session")
        await call(url, "remember", session_id=session_id, key="user", value="Alice")
        own_redis_aof.stop()
        async with Client(url) as client:
            failed = await client.call_tool("recall", {"session_id": session_id, "key": "user"}, raise_on_error=False)
            assert "Redis: Error 111 connecting" in error_text(failed)
            assert "session_id" in (await client.call_tool("list_session_info", {})).data
        own_redis_aof.start()
        assert await call(url, "recall", session_id=session_id, key="user") == "'user' = 'Alice'"
        await call(url, "remember", session_id=session_id, key="user", value="Bob")
        assert await call(url, "recall", session_id=session_id, key="user") == "'user' = 'Bob'"


async def test_redis_outage_fails_every_call_of_a_handshake_session_until_it_returns(
    own_redis_aof: RedisServer,
) -> None:
    # FastMCP reads a handshake session's visibility rules from the state store on every
    # request, so while the store is down even tools that keep no state fail.
    async with (
        open_store(f"redis://127.0.0.1:{own_redis_aof.port}/0", timeout=1) as store,
        connected_client(store) as client,
    ):
        await client.call_tool("set_value", {"key": "user", "value": "Alice"})
        own_redis_aof.stop()
        for tool in ["get_value", "ping"]:
            with pytest.raises(MCPError, match="Redis: Error 111 connecting"):
                await client.call_tool(tool, {"key": "user"} if tool == "get_value" else {})
        own_redis_aof.start()
        assert (await client.call_tool("ping", {})).data == "pong"
        assert (await client.call_tool("get_value", {"key": "user"})).data == "Alice"
