"""Every private or undocumented upstream name kvstores reads, overrides or copies, checked against what is installed.

An upgrade of the MCP SDK, FastMCP, OpenTelemetry, aiosqlite or asyncpg that drops or reshapes one of
these fails here, naming it and the installed version, instead of failing a user at import or
at the first request. The pyproject extras cap each package below its next minor release for
this reason (CHANGELOG.md: Versioning); raise a cap only with this module passing. The
packages pyproject.toml caps are exactly those listed here (read from pyproject.toml, so a cap
dropped or added without its names fails).

To add a name: one row in :data:`NAMES`: (package, "module:object.path", attribute or
parameter names, who uses it and why). An object path that ends in ``()`` is instantiated
first, for attributes set in ``__init__``; ``inspect.signature`` checks parameters.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import tomllib
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


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
        "kvstores.sessions reads and fills the manager's session table to adopt a session, and its"
        " close_sessions() terminates every transport in it on shutdown, as FastMCP's lifespan does",
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
        ("_event_store", "idle_scope", "mcp_session_id", "_read_stream_writer"),
        "kvstores.sessions gives each transport a per-session event store and enters its idle scope, and cancels"
        " a request the event store gave up by writing the client's notifications/cancelled to the transport's"
        " read stream",
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
        "mcp.server.connection:_connection()",
        ("initialized", "client_params"),
        "kvstores.sessions sets an adopted session's client params and initialized event, the handshake done",
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
    # -- kvstores.tasks: the tasks extension's worker side (as fastmcp-tasks 4.1.4 reads them) -----
    Upstream(
        "fastmcp",
        "fastmcp.server.dependencies",
        ("_is_client_tool_call", "_background_task_headers", "_background_task_session_id", "extract_version_spec"),
        "kvstores.tasks tells the client's own tools/call apart and restores the caller's headers and session id",
    ),
    Upstream(
        "fastmcp",
        "fastmcp:FastMCP()",
        ("_extensions", "_mask_error_details"),
        "kvstores.tasks.serve_worker finds StoreTasks on a server; the worker masks tool errors per its policy",
    ),
    Upstream(
        "fastmcp",
        "fastmcp.server.context:Context",
        ("param=task_id", "param=origin_request_id", "input_responses", "request_state"),
        "kvstores.tasks builds the worker's Context of a task",
    ),
    Upstream(
        "fastmcp",
        "fastmcp.server.context:_worker_context()",
        ("_task_input_responses", "_task_request_state"),
        "kvstores.tasks hands a re-entered task the client's answers and its carried request_state",
    ),
    Upstream(
        "fastmcp",
        "fastmcp.server.dependencies:Progress()",
        ("_impl",),
        "kvstores.tasks.StoreProgress hands FastMCP's Progress dependency a recorder that writes to the task",
    ),
    Upstream(
        "fastmcp",
        "fastmcp.server.extensions:ServerExtension",
        ("_server_ref", "clone"),
        "kvstores.tasks.StoreTasks.clone clears the server binding as ServerExtension.clone does",
    ),
    Upstream(
        "fastmcp",
        "fastmcp.tools.function_tool",
        ("_validate_input", "_resolve_param_hints"),
        "kvstores.tasks validates a task's arguments at tools/call as the synchronous path does (as fastmcp-tasks)",
    ),
    Upstream(
        "fastmcp",
        "fastmcp.server.providers.fastmcp_provider:FastMCPProviderTool",
        ("_server",),
        "kvstores.tasks runs a mounted tool with the server it lives on as its context's server (as fastmcp-tasks)",
    ),
    Upstream(
        "mcp",
        "mcp.server.auth.middleware.auth_context",
        ("auth_context_var",),
        "kvstores.tasks restores the caller's access token for get_access_token() in the worker",
    ),
    # -- kvstores._telemetry.reset_providers: OpenTelemetry's provider globals (for the bench) -------
    Upstream(
        "opentelemetry-api",
        "opentelemetry.trace",
        ("_TRACER_PROVIDER", "_TRACER_PROVIDER_SET_ONCE"),
        "kvstores._telemetry.reset_providers resets the tracer provider (the bench's with- and without-SDK rows)",
    ),
    Upstream(
        "opentelemetry-api",
        "opentelemetry.metrics._internal",
        ("_METER_PROVIDER", "_METER_PROVIDER_SET_ONCE"),
        "kvstores._telemetry.reset_providers resets the meter provider (the bench's with- and without-SDK rows)",
    ),
    Upstream(
        "opentelemetry-api",
        "opentelemetry.util._once",
        ("Once",),
        "kvstores._telemetry.reset_providers resets the set-once guards (the bench's with- and without-SDK rows)",
    ),
    # -- kvstores.backends.postgresql: asyncpg's TLS probe (kvstores.backends._asyncpg_fix) ------
    Upstream(
        "asyncpg",
        "asyncpg.connect_utils:TLSUpgradeProto",
        ("__init__", "connection_lost", "data_received"),
        "kvstores.backends._asyncpg_fix wraps the probe's constructor to mark its on_data future's exception"
        " retrieved (tests/test_postgresql.py cuts a connect in the probe and checks nothing is logged)",
    ),
    Upstream(
        "asyncpg",
        "asyncpg.connect_utils:TLSUpgradeProto.__init__",
        ("param=loop", "param=host", "param=port", "param=ssl_context", "param=ssl_is_advisory"),
        "kvstores.backends._asyncpg_fix passes the constructor's arguments through",
    ),
    # -- kvstores.backends.sqlite: aiosqlite's thread queue -------------------------------------
    Upstream(
        "aiosqlite",
        "aiosqlite:Connection",
        ("_execute", "_conn"),
        "kvstores.backends.sqlite runs a whole unit of work on the connection's thread in one hop"
        " (a write through the public calls takes a hop per statement and a lock around the transaction)",
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


def _connection() -> Any:
    from mcp.server.connection import Connection
    from mcp_types.version import LATEST_HANDSHAKE_VERSION

    return Connection.from_envelope(LATEST_HANDSHAKE_VERSION, None, None)


def _worker_context() -> Any:
    from fastmcp import FastMCP
    from fastmcp.server.context import Context

    return Context(FastMCP("canary"), task_id="t")


_FACTORIES = {
    "_worker_context()": _worker_context,
    "_manager()": _manager,
    "_transport()": _transport,
    "_connection()": _connection,
}


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


PYPROJECT = Path(__file__).parent.parent / "pyproject.toml"

_UPPER_BOUNDS = frozenset({"<", "<=", "~="})


def capped_extras(pyproject: str) -> set[str]:
    """The packages that an extra of ``pyproject`` (its text) bounds from above."""
    extras = tomllib.loads(pyproject)["project"]["optional-dependencies"]
    return {
        canonicalize_name(requirement.name)
        for requirements in extras.values()
        for requirement in map(Requirement, requirements)
        if any(specifier.operator in _UPPER_BOUNDS for specifier in requirement.specifier)
    }


def _checked_packages() -> set[str]:
    return {canonicalize_name(row.package) for row in NAMES}


def test_every_capped_extra_is_checked_here() -> None:
    """The extras pyproject.toml caps for private names are exactly the packages this module checks."""
    assert capped_extras(PYPROJECT.read_text()) == _checked_packages()


@pytest.mark.parametrize("package", sorted({row.package for row in NAMES}))
def test_the_check_fails_when_a_cap_is_removed(package: str) -> None:
    """pyproject.toml without ``package``'s cap no longer passes the completeness check above."""
    text = PYPROJECT.read_text()
    uncapped = re.sub(rf'"{re.escape(package)}([^",<]*),<[^"]*"', rf'"{package}\1"', text)
    assert uncapped != text, f"pyproject.toml has no cap on {package} to remove"
    assert package not in capped_extras(uncapped)
    assert capped_extras(uncapped) != _checked_packages()


# -- kvstores' own modules: none reads another's private names ------------------------------------
#
# What a module needs from another is a public (documented) name of that module or object. A class's
# own private names used anywhere in its own module are fine, and so is importing a private module
# (``from kvstores import _telemetry``): the rule is about the private names inside it. The scan is by
# name, not by type: a private attribute counts as kvstores' when some kvstores module defines it
# (a ``def``, a class or module assignment, or ``self.`` / ``cls.``), as another package's otherwise.

PACKAGE = Path(__file__).parent.parent / "kvstores"


@dataclass(frozen=True)
class Access:
    """One use of a private name outside ``self`` / ``cls``: an attribute, a getattr() or a from-import."""

    module: str
    """The kvstores module that uses it."""
    line: int
    text: str
    """The expression (``store._tables``) or import (``from kvstores.base import _OBSERVED``)."""
    name: str
    """The private name."""
    source: str | None = None
    """For a from-import, the module it is imported from."""

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.text}"


ALLOWED: dict[tuple[str, str], str] = {
    ("kvstores.signals", "getattr(type(store), '_signal_transport', None)"): (
        "BaseStore._signal_transport is a backend hook (base.py: the backend contract): each backend overrides it"
        " and kvstores.signals, which its docstring names, is its one caller"
    ),
    ("kvstores.signals", "store._signal_channel"): (
        "BaseStore._signal_channel is the slot the base keeps for kvstores.signals.channel() (its aclose()"
        " closes the channel); kvstores.signals is its one writer"
    ),
    ("kvstores.tasks._runner", "tool._server"): (
        "FastMCP's FastMCPProviderTool._server (a kvstores module has a _server of its own): fenced in NAMES above"
    ),
    ("kvstores.backends.sqlite", "db._execute"): (
        "aiosqlite's Connection._execute (kvstores' MySQL and Redis backends have an _execute of their own):"
        " fenced in NAMES above"
    ),
}
"""Uses of another kvstores module's private name that stay, each with its reason."""

UPSTREAM_PUBLIC = {
    "_replace": "namedtuple's documented API (urllib.parse's SplitResult._replace)",
}
"""Private-looking names of other packages that are documented public API."""


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str) -> bool:
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _on_itself(node: ast.expr) -> bool:
    """``self.x``, ``cls.x``, ``super().x``, ``type(self).x``: the object's own attribute."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and (node.func.id == "super" or (node.func.id == "type" and len(node.args) == 1 and _on_itself(node.args[0])))
    )


def _defined(tree: ast.Module) -> set[str]:
    """The private names a module defines: functions, classes, assigned names, ``self.`` / ``cls.`` attributes."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _on_itself(node.value):
            names.add(node.attr)
    return set(filter(_private, names))


def _uses(module: str, tree: ast.Module) -> list[Access]:
    """The private names ``module`` uses on something other than ``self`` / ``cls``."""
    found: list[Access] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _on_itself(node.value):
            found.append(Access(module, node.lineno, ast.unparse(node), node.attr))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and not _on_itself(node.args[0])
        ):
            found.append(Access(module, node.lineno, ast.unparse(node), node.args[1].value))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if _private(alias.name) and not _is_module(f"{node.module}.{alias.name}"):
                    text = f"from {node.module} import {alias.name}"
                    found.append(Access(module, node.lineno, text, alias.name, node.module))
            found.extend(_private_modules(module, node.lineno, node.module))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found.extend(_private_modules(module, node.lineno, alias.name))
    return found


def _private_modules(module: str, line: int, imported: str) -> list[Access]:
    """Another package's private modules on the path ``imported`` (kvstores' own are free to import)."""
    if imported.split(".")[0] == "kvstores":
        return []
    return [
        Access(module, line, f"import {imported}", part, imported) for part in imported.split(".") if _private(part)
    ]


def _scan() -> tuple[list[Access], list[Access]]:
    """Uses of another kvstores module's private names, and of other packages' private names."""
    trees = {_module_name(path): ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}
    defined = {module: _defined(tree) for module, tree in trees.items()}
    ours: list[Access] = []
    theirs: list[Access] = []
    for module, tree in trees.items():
        for use in _uses(module, tree):
            if use.source is not None:
                if use.source == module:
                    continue
                (ours if use.source.split(".")[0] == "kvstores" else theirs).append(use)
            elif use.name in defined[module]:
                continue
            elif any(use.name in names for other, names in defined.items() if other != module):
                ours.append(use)
            else:
                theirs.append(use)
    return ours, theirs


def test_no_module_reads_another_modules_private_names() -> None:
    """Every private name a kvstores module uses is its own (or allowed above, with its reason)."""
    ours, _ = _scan()
    reads = [str(use) for use in ours if (use.module, use.text) not in ALLOWED]
    assert not reads, (
        "kvstores modules read another module's private names; give the owner a documented public"
        " (or internal-API) name instead:\n  " + "\n  ".join(reads)
    )


def test_every_allowed_read_is_still_there() -> None:
    """An entry of ALLOWED that no longer matches anything goes (it would hide a new use)."""
    ours, _ = _scan()
    assert set(ALLOWED) <= {(use.module, use.text) for use in ours}


def _fenced() -> set[str]:
    """The names NAMES checks: its attributes, and each part of its targets' paths."""
    names = {name for row in NAMES for name in row.names if not name.startswith("param=")}
    for row in NAMES:
        names.update(re.split(r"[.:()]+", row.target))
    return names


def test_every_upstream_private_name_is_fenced() -> None:
    """A private name of another package that kvstores uses is checked by a row of NAMES."""
    _, theirs = _scan()
    unfenced = [str(use) for use in theirs if use.name not in _fenced() and use.name not in UPSTREAM_PUBLIC]
    assert not unfenced, (
        "kvstores uses private names of other packages that no row of NAMES checks (add one, and cap"
        " the package in pyproject.toml):\n  " + "\n  ".join(unfenced)
    )


def test_the_scan_sees_a_private_read() -> None:
    """The scan flags what it is meant to: an attribute, a getattr() and a from-import of another module's."""
    tree = ast.parse(
        "from kvstores.base import _OBSERVED\n"
        "from kvstores import _telemetry\n"
        "def f(store):\n"
        "    self = store\n"
        "    return store._reseal, getattr(store, '_sealer'), self._own, super()._own, _telemetry.trace\n"
    )
    assert [use.text for use in _uses("kvstores.example", tree)] == [
        "from kvstores.base import _OBSERVED",
        "store._reseal",
        "getattr(store, '_sealer')",
    ]
