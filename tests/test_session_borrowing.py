"""A session id cannot be borrowed (DESIGN §9): on every row of the backend table, for both apps.

Principal X opens a handshake session on server 1 of a pair sharing one store and keeps state in
it. Principal Y then sends X's ``Mcp-Session-Id`` to both servers, in both request eras, before and
after X's DELETE: a handshake-era request is refused (404); a 2026-07-28 (sessionless) request is
served without the header, so it never reads or writes X's state (FastMCP keys the state of a
request without a session by that header). X's own sessionless requests get the same treatment.
The servers are ``kvstores.sessions.http_app`` (two uvicorn processes, or two apps in this process
for the rows other processes cannot open) and FastMCP's own ``mcp.http_app()`` wrapped in
``SessionIdGuard`` (two apps in this process). Neither server pair logs X's session id whole.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvstores.sessions import SessionIdGuard
from tests.support import Backend
from tests.support.events import PROTOCOL_VERSION, serving
from tests.support.sessions import (
    SDK_SESSION_LOGGER,
    Router,
    SessionServer,
    build_app,
    label,
    modern_client,
    routed_client,
)

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

OWNER, OTHER = "token-x", "token-y"
"""Bearer tokens of the two principals (tests.support.sessions.TOKENS)."""

STATE_COLLECTION = "fastmcp_state"
"""Where FastMCP keeps ``ctx.set_state`` values, keyed ``<session id>:<key>``."""


async def call(client: Any, tool: str, **arguments: Any) -> Any:
    return (await client.call_tool(tool, arguments)).data


async def handshake_status(url: str, session_id: str, token: str) -> int:
    """The HTTP status of a handshake-era tools/list in session ``session_id`` with ``token``."""
    headers = {
        "accept": "application/json, text/event-stream",
        "authorization": f"Bearer {token}",
        "mcp-protocol-version": PROTOCOL_VERSION,
        "mcp-session-id": session_id,
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with httpx.AsyncClient(timeout=10) as http, http.stream("POST", url, headers=headers, json=body) as response:
        return response.status_code


async def assert_not_borrowed(urls: list[str], session_id: str) -> None:
    """Nobody reaches the session's state through ``session_id`` on any of ``urls``."""
    for url in urls:
        assert await handshake_status(url, session_id, OTHER) == 404
        for token in (OTHER, OWNER):
            async with modern_client(url, token=token, session_id=session_id) as client:
                assert await call(client, "get_state", key="k") is None
                assert await call(client, "set_state", key="k", value=token) != session_id


def port_of(url: str) -> int:
    return int(url.split(":")[2].split("/")[0])


@asynccontextmanager
async def server_pair(
    kind: str, backend: Backend, namespace: str, store: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> AsyncIterator[tuple[list[str], Callable[[], str]]]:
    """Two servers of ``kind`` on the test's namespace: their URLs and a function returning their logs."""
    caplog.set_level(logging.DEBUG, logger="kvstores")
    caplog.set_level(logging.INFO, logger=SDK_SESSION_LOGGER)
    async with AsyncExitStack() as stack:
        if kind == "http_app" and backend.processes:
            url, options = backend.url(namespace)
            servers = [SessionServer(url, options, tmp_path, auth=True) for _ in range(2)]
            stack.callback(lambda: [server.stop() for server in servers])
            for server in servers:
                server.start()
            for server in servers:
                server.wait_until_serving()
            yield [server.url for server in servers], lambda: "".join(s.log.read_text() for s in servers)
        else:
            apps = [build_app(store, auth=True, durable=kind == "http_app") for _ in range(2)]
            urls = [await stack.enter_async_context(serving(app)) for app in apps]
            yield urls, lambda: caplog.text


@pytest.mark.parametrize("kind", ["http_app", "fastmcp"])
async def test_a_session_id_cannot_be_borrowed(
    kind: str, backend: Backend, namespace: str, store: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with server_pair(kind, backend, namespace, store, tmp_path, caplog) as (urls, logs):
        async with routed_client(Router(port_of(urls[0])), token=OWNER) as owner:
            session_id = await call(owner, "set_state", key="k", value="owner's")
            await assert_not_borrowed(urls, session_id)
            assert await call(owner, "get_state", key="k") == "owner's"
        # Leaving the client sent its DELETE; the state stays in the store until it expires.
        await assert_not_borrowed(urls, session_id)
        assert (await store.get(f"{session_id}:k", collection=STATE_COLLECTION))["value"] == "owner's"
        if kind == "http_app":
            assert session_id not in logs()
            assert f"Refusing session {label(session_id)}" in logs()  # Y's handshake-era requests, by label
            assert f"session ID: {label(session_id)}" in logs()  # the SDK's line on opening it, redacted


@pytest.mark.parametrize(
    ("versions", "kept"),
    [
        ([], True),  # no version header: the handshake era (the SDK's default)
        (["2025-11-25"], True),
        (["2024-11-05"], True),
        (["2026-07-28"], False),
        (["1999-01-01"], False),  # the SDK's sessionless entry answers unknown versions
        (["2026-07-28", "2025-11-25"], False),  # a duplicate: whichever the SDK reads, no session
        (["2025-11-25", "2026-07-28"], False),
    ],
)
async def test_the_guard_removes_the_session_id_of_every_request_the_sdk_serves_without_a_session(
    versions: list[str], kept: bool
) -> None:
    seen: list[list[tuple[bytes, bytes]]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope.get("headers", []))

    headers = [(b"mcp-protocol-version", v.encode()) for v in versions]
    headers += [(b"mcp-session-id", b"s" * 32), (b"Mcp-Session-Id", b"t" * 32), (b"accept", b"*/*")]
    guard = SessionIdGuard(app)
    await guard({"type": "http", "headers": headers}, None, None)
    await guard({"type": "lifespan"}, None, None)
    expected = headers if kept else [header for header in headers if header[0].lower() != b"mcp-session-id"]
    assert seen == [expected, []]  # and other scopes pass untouched
