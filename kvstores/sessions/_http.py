"""The MCP SDK and FastMCP side of durable sessions: :func:`http_app`, and the names the package exports from it.

See :mod:`kvstores.sessions` for what survives and what it costs; the records live in
:mod:`kvstores.sessions._registry`, the session manager in :mod:`kvstores.sessions._manager`,
the guard in :mod:`kvstores.sessions._guard`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from kvstores._optional import missing_extra
from kvstores.sessions._registry import DEFAULT_IDLE_TTL, SessionRegistry

try:
    import fastmcp
    from fastmcp.server.http import StarletteWithLifespan, StreamableHTTPASGIApp
    from mcp.server.streamable_http import EventStore
    from mcp.server.transport_security import TransportSecuritySettings
    from starlette.routing import Route

    from kvstores.sessions._guard import SessionIdGuard
    from kvstores.sessions._manager import DurableSessionManager
    from kvstores.sessions._terminations import TERMINATIONS
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra(getattr(exc, "name", None) or "fastmcp", "fastmcp") from exc

if TYPE_CHECKING:
    from fastmcp import FastMCP

    from kvstores.protocol import AsyncKeyValue

__all__ = ["TERMINATIONS", "DurableSessionManager", "SessionIdGuard", "http_app"]


def _streamable_endpoint(app: StarletteWithLifespan) -> StreamableHTTPASGIApp:
    """The object FastMCP's Streamable HTTP route hands each request to (auth middleware unwrapped)."""
    for route in app.routes:
        endpoint = getattr(route, "endpoint", None) if isinstance(route, Route) else None
        for candidate in (endpoint, getattr(endpoint, "app", None)):
            if isinstance(candidate, StreamableHTTPASGIApp):
                return candidate
    raise RuntimeError("durable sessions: FastMCP's app has no Streamable HTTP route (transport must be 'http')")


def http_app(
    mcp: FastMCP[Any],
    *,
    store: AsyncKeyValue,
    event_store: EventStore | None = None,
    idle_ttl: float = DEFAULT_IDLE_TTL,
    **kwargs: Any,
) -> StarletteWithLifespan:
    """``mcp.http_app(**kwargs)`` with durable sessions: session ids recorded on ``store`` and adopted by any process.

    ``event_store`` (shared by every process for resumability across them, e.g.
    ``StoreEventStore(store)``) is scoped per session. ``idle_ttl`` is how long a session stays
    adoptable after its last request. The other arguments are those of ``FastMCP.http_app``;
    the transport must be Streamable HTTP and stateful.
    """
    if kwargs.get("transport", "http") not in ("http", "streamable-http"):
        raise ValueError(f"durable sessions need the Streamable HTTP transport, not {kwargs['transport']!r}")
    stateless = kwargs.get("stateless_http")
    if stateless if stateless is not None else fastmcp.settings.stateless_http:
        raise ValueError("durable sessions need stateful HTTP: a stateless_http app has no sessions to keep")
    registry = SessionRegistry(store, idle_ttl=idle_ttl)
    app = mcp.http_app(**kwargs)
    endpoint = _streamable_endpoint(app)
    json_response = kwargs.get("json_response")
    idle_timeout = kwargs.get("session_idle_timeout")
    if idle_timeout is None:
        idle_timeout = fastmcp.settings.http_session_idle_timeout
    timeout_option: dict[str, float | None] = {} if idle_timeout == "auto" else {"session_idle_timeout": idle_timeout}

    # FastMCP's own lifespan builds its session manager; this one builds the durable one with
    # the same settings, and ends the transports gracefully on shutdown as FastMCP does.
    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        manager = DurableSessionManager(
            mcp._mcp_server,
            registry=registry,
            event_store=event_store,
            json_response=json_response if json_response is not None else fastmcp.settings.json_response,
            retry_interval=kwargs.get("retry_interval"),
            # FastMCP owns DNS-rebinding protection (its Host/Origin guard), so the SDK's is off.
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            **timeout_option,
        )
        endpoint.session_manager = manager
        async with manager.run():
            try:
                yield
            finally:
                await manager.close_sessions()

    app.router.lifespan_context = lifespan
    app.state.session_registry = registry
    app.add_middleware(SessionIdGuard)
    return app
