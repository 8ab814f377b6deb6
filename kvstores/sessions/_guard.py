"""The guard that keeps a sessionless (2026-07-28) request out of any handshake session's state."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["SessionIdGuard"]

logger = logging.getLogger("kvstores.sessions")  # the public name, whatever module logs


class SessionIdGuard:
    """ASGI middleware: a sessionless (2026-07-28) request reaches the app without its ``Mcp-Session-Id``.

    The SDK serves a request whose ``MCP-Protocol-Version`` is not a handshake-era version
    without any session, and FastMCP then keys that request's ``ctx.get_state`` /
    ``ctx.set_state`` by its ``Mcp-Session-Id`` header: whoever knows a session's id would read
    and overwrite that session's state, with any credentials, even after the session ended.
    With the header removed the request is served as what it says it is, sessionless, with
    state of its own. :func:`http_app` installs it; FastMCP's own app takes it in one line,
    ``app = SessionIdGuard(mcp.http_app())`` (or ``mcp.http_app(middleware=[Middleware(SessionIdGuard)])``).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _is_sessionless(scope["headers"]):
            headers = [(name, value) for name, value in scope["headers"] if name.lower() != _SESSION_ID_HEADER]
            if len(headers) != len(scope["headers"]):
                logger.debug("Removed the Mcp-Session-Id header of a sessionless (%s) request", _era(scope["headers"]))
                scope = {**scope, "headers": headers}
        await self.app(scope, receive, send)


_SESSION_ID_HEADER = MCP_SESSION_ID_HEADER.lower().encode("latin-1")
_PROTOCOL_VERSION_HEADER = MCP_PROTOCOL_VERSION_HEADER.lower().encode("latin-1")


def _era(headers: Iterable[tuple[bytes, bytes]]) -> list[str]:
    """The request's ``MCP-Protocol-Version`` values (a well-formed request has at most one)."""
    return [value.decode("latin-1") for name, value in headers if name.lower() == _PROTOCOL_VERSION_HEADER]


def _is_sessionless(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """True when any ``MCP-Protocol-Version`` of the request is not a handshake-era version.

    The SDK routes a request to its sessionless entry when its (first) such header names a
    version other than a handshake-era one; any, not first, removes the header in every case
    the SDK might route there, and from malformed requests that the handshake path refuses anyway.
    """
    return any(version not in HANDSHAKE_PROTOCOL_VERSIONS for version in _era(headers))
