"""Every private or undocumented upstream name kvstores reads, overrides or copies, checked against what is installed.

An upgrade of the MCP SDK, FastMCP, OpenTelemetry or aiosqlite that drops or reshapes one of
these fails here, naming it and the installed version, instead of failing a user at import or
at the first request. The pyproject extras cap each package below its next minor release for
this reason (CHANGELOG.md: Versioning); raise a cap only with this module passing.

To add a name: one row in :data:`NAMES`: (package, "module:object.path", attribute or
parameter names, who uses it and why). An object path that ends in ``()`` is instantiated
first, for attributes set in ``__init__``; ``inspect.signature`` checks parameters.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import pytest


@dataclass(frozen=True)
class Upstream:
    """Names kvstores needs on one upstream object."""

    package: str
    """The distribution whose version is reported (and capped in pyproject.toml)."""
    target: str
    """``module:object.path``; ``module:Class()`` means an instance built with no arguments."""
    names: tuple[str, ...]
    """Attributes that must exist, or ``param=`` entries: parameters its signature must accept."""
    why: str
    """Who in kvstores uses them, for what."""


NAMES: list[Upstream] = [
    # -- kvstores.sessions: DurableSessionManager subclasses the SDK's session manager ------------
    Upstream(
        "mcp",
        "mcp.server.streamable_http_manager:StreamableHTTPSessionManager",
        ("_handle_stateful_request", "_admit_session", "_discard_session", "run", "handle_request"),
        "kvstores.sessions.DurableSessionManager overrides the request path, admission and discard",
    ),
    Upstream(
        "mcp",
        "mcp.server.streamable_http_manager:_manager()",
        (
            "_server_instances",
            "_session_owners",
            "_session_creation_lock",
            "_task_group",
            "_lifespan_state",
            "app",
            "json_response",
            "security_settings",
            "retry_interval",
            "session_idle_timeout",
            "max_sessions",
        ),
        "kvstores.sessions reads and fills the manager's session table to adopt a session",
    ),
    Upstream(
        "mcp",
        "mcp.server.streamable_http_manager:StreamableHTTPSessionManager._admit_session",
        ("param=requestor",),
        "kvstores.sessions overrides _admit_session(requestor)",
    ),
    Upstream(
        "mcp",
        "mcp.server.streamable_http_manager:StreamableHTTPSessionManager._discard_session",
        ("param=session_id", "param=transport"),
        "kvstores.sessions overrides _discard_session(session_id, transport)",
    ),
    Upstream(
        "mcp",
        "mcp.server.streamable_http_manager:StreamableHTTPSessionManager._handle_stateful_request",
        ("param=scope", "param=receive", "param=send"),
        "kvstores.sessions overrides _handle_stateful_request(scope, receive, send)",
    ),
    Upstream(
        "mcp",
        "mcp.server.streamable_http:StreamableHTTPServerTransport",
        (
            "param=mcp_session_id",
            "param=is_json_response_enabled",
            "param=event_store",
            "param=security_settings",
            "param=retry_interval",
            "param=idle_timeout",
            "connect",
            "terminate",
        ),
        "kvstores.sessions builds an adopted session's transport as the SDK's manager does",
    ),
    Upstream(
        "mcp",
        "mcp.server.streamable_http:_transport()",
        ("_event_store", "idle_scope", "mcp_session_id"),
        "kvstores.sessions gives each transport a per-session event store and enters its idle scope",
    ),
    # -- kvstores.sessions: a copy of the SDK's serve loop for an adopted session -----------------
    Upstream(
        "mcp",
        "mcp.server.connection:Connection",
        ("for_loop", "client_params"),
        "kvstores.sessions restores an adopted session's handshake on a new Connection",
    ),
    Upstream(
        "mcp",
        "mcp.server.connection:Connection.for_loop",
        ("param=session_id", "param=protocol_version_hint"),
        "kvstores.sessions builds the adopted session's Connection as the SDK's serve loop does",
    ),
    Upstream(
        "mcp",
        "mcp.server.runner:serve_connection",
        ("param=server", "param=dispatcher", "param=connection", "param=lifespan_state"),
        "kvstores.sessions serves an adopted session with the SDK's own connection runner",
    ),
    Upstream(
        "mcp",
        "mcp.shared.jsonrpc_dispatcher:JSONRPCDispatcher",
        ("param=inline_methods",),
        "kvstores.sessions builds the adopted session's dispatcher as the SDK's serve loop does",
    ),
    Upstream(
        "mcp",
        "mcp.server.streamable_http",
        ("MCP_SESSION_ID_HEADER", "SESSION_ID_PATTERN", "EventStore"),
        "kvstores.sessions validates session ids as the SDK does",
    ),
    Upstream(
        "mcp",
        "mcp.server.auth.middleware.bearer_auth",
        ("AuthenticatedUser", "AuthorizationContext", "authorization_context"),
        "kvstores.sessions binds a session to its creator exactly as the SDK compares owners",
    ),
    Upstream(
        "mcp",
        "mcp_types.version",
        ("HANDSHAKE_PROTOCOL_VERSIONS", "LATEST_HANDSHAKE_VERSION"),
        "kvstores.sessions records the protocol version the SDK negotiates",
    ),
    # -- kvstores.sessions: FastMCP's app ---------------------------------------------------------
    Upstream(
        "fastmcp",
        "fastmcp:FastMCP()",
        ("_mcp_server", "http_app"),
        "kvstores.sessions.http_app hands FastMCP's low-level server to the durable manager",
    ),
    Upstream(
        "fastmcp",
        "fastmcp.server.http:StreamableHTTPASGIApp(None)",
        ("session_manager",),
        "kvstores.sessions.http_app swaps the session manager FastMCP's route calls",
    ),
    Upstream(
        "fastmcp",
        "fastmcp.server.http",
        ("StarletteWithLifespan", "StreamableHTTPASGIApp"),
        "kvstores.sessions.http_app finds FastMCP's Streamable HTTP route and replaces the router's lifespan",
    ),
    Upstream(
        "fastmcp",
        "fastmcp.server.session_scoped_event_store",
        ("SessionScopedEventStore",),
        "kvstores.sessions scopes the shared event store per session as FastMCP does",
    ),
    Upstream(
        "fastmcp",
        "fastmcp:settings",
        ("stateless_http", "json_response", "http_session_idle_timeout"),
        "kvstores.sessions.http_app applies FastMCP's defaults to the durable manager",
    ),
    Upstream(
        "fastmcp",
        "fastmcp:Context",
        ("_STATE_TTL_SECONDS",),
        "kvstores.harness.FASTMCP_STATE_TTL mirrors the TTL FastMCP gives ctx state",
    ),
    # -- kvstores._telemetry and kvstores.bench._otel: OpenTelemetry's provider globals ----------
    Upstream(
        "opentelemetry-api",
        "opentelemetry.trace",
        ("_TRACER_PROVIDER", "_TRACER_PROVIDER_SET_ONCE"),
        "kvstores._telemetry.active() checks for an SDK once per call; the bench resets it",
    ),
    Upstream(
        "opentelemetry-api",
        "opentelemetry.metrics._internal",
        ("_METER_PROVIDER", "_METER_PROVIDER_SET_ONCE"),
        "kvstores._telemetry.active() checks for an SDK once per call; the bench resets it",
    ),
    Upstream(
        "opentelemetry-api",
        "opentelemetry.util._once",
        ("Once",),
        "kvstores.bench._otel resets the set-once guards between its with- and without-SDK rows",
    ),
    # -- kvstores.backends.sqlite: aiosqlite's thread queue -------------------------------------
    Upstream(
        "aiosqlite",
        "aiosqlite:Connection",
        ("_execute",),
        "kvstores.backends.sqlite runs a whole unit of work on the connection's thread in one hop",
    ),
    Upstream(
        "aiosqlite",
        "aiosqlite:Connection._execute",
        ("param=fn",),
        "kvstores.backends.sqlite calls db._execute(work, db._conn)",
    ),
]


def _manager() -> Any:
    from mcp.server.lowlevel import Server
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    return StreamableHTTPSessionManager(app=Server("kvstores-private-names"))


def _transport() -> Any:
    from mcp.server.streamable_http import StreamableHTTPServerTransport

    return StreamableHTTPServerTransport(mcp_session_id="0123456789abcdef")


_FACTORIES = {"_manager()": _manager, "_transport()": _transport}


def _resolve(target: str) -> Any:
    """The object ``module:path`` names (instantiated when the path ends in ``()``)."""
    module_name, _, path = target.partition(":")
    found: Any = importlib.import_module(module_name)
    if path in _FACTORIES:
        return _FACTORIES[path]()
    for part in filter(None, path.split(".")):
        call = part.endswith(")")
        name, _, argument = part.partition("(")
        found = getattr(found, name)
        if call:
            found = found(None) if argument == "None)" else found()
    return found


def _accepts(function: Any, parameter: str) -> bool:
    parameters = inspect.signature(function).parameters
    return parameter in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _row_id(row: Upstream) -> str:
    return row.target


@pytest.mark.parametrize("row", NAMES, ids=_row_id)
def test_upstream_name_is_there(row: Upstream) -> None:
    pytest.importorskip(row.target.partition(":")[0], reason=f"{row.package} is not installed")
    installed = f"{row.package} {version(row.package)}"
    try:
        found = _resolve(row.target)
    except (AttributeError, ImportError, TypeError) as exc:
        pytest.fail(f"{row.target} is gone or changed in {installed}: {exc!r}. Needed by {row.why}.")
    missing = []
    for name in row.names:
        if name.startswith("param="):
            if not _accepts(found, name.removeprefix("param=")):
                missing.append(f"parameter {name.removeprefix('param=')!r}")
        elif not hasattr(found, name):
            missing.append(repr(name))
    assert not missing, (
        f"{installed} no longer has {', '.join(missing)} on {row.target}, which {row.why}. "
        f"Keep the pyproject cap below this version, or port kvstores to it and update tests/test_private_names.py."
    )


def test_every_capped_extra_is_checked_here() -> None:
    """The extras capped for private names are exactly the packages this module checks."""
    assert {row.package for row in NAMES} == {"mcp", "fastmcp", "opentelemetry-api", "aiosqlite"}
