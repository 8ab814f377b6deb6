"""The MCP SDK and FastMCP side of durable sessions: the session manager, the guard and ``http_app``.

See :mod:`kvstores.sessions` for what survives and what it costs; the records live in
:mod:`kvstores.sessions._registry`.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import anyio

from kvstores._optional import missing_extra
from kvstores.base import BaseStore
from kvstores.sessions._registry import (
    DEFAULT_IDLE_TTL,
    SessionRecord,
    SessionRecordError,
    SessionRegistry,
    _digest,
    _label,
    _scrubbed,
)
from kvstores.signals import SignalChannel
from kvstores.signals import channel as signals_channel

try:
    import fastmcp
    from fastmcp.server.http import StarletteWithLifespan, StreamableHTTPASGIApp
    from fastmcp.server.session_scoped_event_store import SessionScopedEventStore
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, AuthorizationContext, authorization_context
    from mcp.server.connection import Connection
    from mcp.server.runner import serve_connection
    from mcp.server.streamable_http import (
        GET_STREAM_KEY,
        MCP_SESSION_ID_HEADER,
        SESSION_ID_PATTERN,
        EventCallback,
        EventId,
        EventStore,
        StreamableHTTPServerTransport,
        StreamId,
    )
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.server.transport_security import TransportSecuritySettings
    from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
    from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
    from mcp.shared.message import SessionMessage
    from mcp.shared.transport_context import TransportContext
    from mcp_types import (
        INTERNAL_ERROR,
        INVALID_REQUEST,
        ErrorData,
        InitializeRequestParams,
        JSONRPCError,
        JSONRPCMessage,
        JSONRPCNotification,
    )
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION
    from pydantic import ValidationError
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from kvstores.events import StoreEventStore
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra(getattr(exc, "name", None) or "fastmcp", "fastmcp") from exc

if TYPE_CHECKING:
    from anyio.abc import TaskStatus
    from fastmcp import FastMCP
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from kvstores.protocol import AsyncKeyValue

__all__ = ["TERMINATIONS", "DurableSessionManager", "SessionIdGuard", "http_app"]

logger = logging.getLogger("kvstores.sessions")  # the public name, whatever module logs

_MAX_SESSION_ID_LENGTH = 256
"""Longer ids are never looked up (the SDK's own are 32 characters)."""

_MAX_HANDSHAKE_BYTES = 64 * 1024
"""An opening request body larger than this is not read for its handshake; its session is recorded without."""

_BOOKKEEPING_TIMEOUT = 10.0
"""Seconds shielded registry bookkeeping may take after a request before it is given up."""

TERMINATIONS = "sessions"
"""The signal channel (kvstores.signals) on which a DELETE names its session (by the SHA-256 of its id)."""

_TERMINATION_POLL = 0.5
"""Seconds between two checks of the sessions held, on a kvstores store without a signal channel."""

_RECHECK_BATCH = 500
"""Session records read per round trip when the sessions held are checked after a signal GAP."""

_REQUEST_BODY: contextvars.ContextVar[bytearray | None] = contextvars.ContextVar("kvstores_request_body", default=None)
"""The body of the POST being handled, as received: read (parsed) only when the transport primes a request stream."""

_SDK_SESSION_ID = re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{32}(?![0-9A-Za-z])")
"""A session id as the SDK makes them (``uuid4().hex``), in a line of its log."""


class _SessionIdRedaction(logging.Filter):
    """Replaces the session ids in the SDK session manager's log lines (it logs them whole) by their labels."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _SDK_SESSION_ID.sub(lambda found: _label(found[0]), message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def _redact_sdk_logs() -> None:
    """Install :class:`_SessionIdRedaction` on the SDK session manager's logger, once per process."""
    sdk_logger = logging.getLogger(StreamableHTTPSessionManager.__module__)
    if not any(isinstance(existing, _SessionIdRedaction) for existing in sdk_logger.filters):
        sdk_logger.addFilter(_SessionIdRedaction())


def _negotiated_version(handshake: Mapping[str, Any] | None) -> str | None:
    """The protocol version the SDK negotiates for these ``initialize`` params."""
    if handshake is None:
        return None
    requested = handshake.get("protocolVersion")
    return requested if requested in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION


class DurableSessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager, plus a :class:`SessionRegistry` and a per-session event store.

    Takes the SDK manager's arguments and ``registry``. It registers each session it opens,
    adopts a registered, unterminated session id it does not hold (when the credentials match
    its creator's), records a DELETE as termination, and gives each session's transport a view
    of ``event_store`` scoped to the session id, so that any process can replay a session's
    events to that session only. Every refusal (unknown, ended or another principal's session)
    is the SDK's 404, answered here so that no line logs the id. Works with a plain SDK
    ``Server`` as well as under :func:`http_app`.
    """

    def __init__(self, app: Any, *, registry: SessionRegistry, event_store: EventStore | None = None, **kwargs: Any):
        if kwargs.get("stateless"):
            raise ValueError("durable sessions need a stateful session manager: stateless mode has no sessions")
        # The SDK gets no store: every transport receives its own scoped view instead.
        super().__init__(app, event_store=None, **kwargs)
        _redact_sdk_logs()
        self.registry = registry
        self.shared_event_store = event_store
        if isinstance(event_store, StoreEventStore):
            event_store.live = True  # replicas follow each other's streams and answer for a dead one
        self._checked: dict[str, float] = {}  # session id -> monotonic time of its last registry check
        self._digests: dict[str, str] = {}  # _digest(id) -> id of each session held here
        self._closing = False

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """The SDK manager's ``run()``, also refusing at once the sessions a DELETE ends on another process."""
        try:
            async with super().run():
                stop = await self._watch_terminations()
                try:
                    yield
                finally:
                    stop()
        finally:
            await self._close_channels()  # once the sessions' tasks are gone: nothing signals any more

    # -- request paths -----------------------------------------------------------------

    async def _handle_stateful_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            await self._handle_session_request(scope, receive, send)
            return
        body = bytearray()

        async def receive_keeping_body() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
            return message

        kept = _REQUEST_BODY.set(body)
        try:
            await self._handle_session_request(scope, receive_keeping_body, send)
        finally:
            _REQUEST_BODY.reset(kept)

    async def _handle_session_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        session_id = Request(scope).headers.get(MCP_SESSION_ID_HEADER)
        if session_id is None:
            await self._open_session(scope, receive, send)
            return
        requestor = _requestor(scope)
        transport = self._server_instances.get(session_id)
        if transport is None:
            refusal = await self._adopt(session_id, requestor)
        elif requestor != self._session_owners.get(session_id):
            refusal = _refused_to_another(session_id)  # what the SDK answers, without logging the id
        else:
            refusal = await self._revalidate(session_id, transport)
        deleting = refusal is None and scope["method"] == "DELETE"
        if deleting and not await self._record_termination(session_id, announce=False):
            refusal = _error_response("Could not record the session's termination; the session goes on", 503)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        try:
            await super()._handle_stateful_request(scope, receive, send)
        finally:
            if deleting:  # announced once the SDK ended it here: its own echo must not beat the DELETE to it
                await self._announce_termination(session_id)

    async def _open_session(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Let the SDK open a session; record it before the response hands the client its id."""
        requestor = _requestor(scope)
        opened: list[str] = []

        async def send_after_registering(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400 and not opened:
                new_id = _response_session_id(message)
                if new_id is not None and new_id in self._server_instances:
                    opened.append(new_id)
                    await self._register(new_id, requestor, _initialize_params(_REQUEST_BODY.get() or b""))
            await send(message)

        try:
            await super()._handle_stateful_request(scope, receive, send_after_registering)
        finally:
            # The SDK drops a session whose opening request failed or was cancelled after its
            # response started; the client may hold its id, so no other process may adopt it.
            abandoned = [sid for sid in opened if sid not in self._server_instances and not self._closing]
            if abandoned:
                for sid in abandoned:
                    await self._record_termination(sid)

    async def _adopt(self, session_id: str, requestor: dict[str, Any] | None) -> Response | None:
        """Serve a registered session here; return the response that refuses it instead (None: serve it)."""
        if len(session_id) > _MAX_SESSION_ID_LENGTH or not SESSION_ID_PATTERN.fullmatch(session_id):
            return _session_not_found()
        try:
            record = await self.registry.get(session_id)
        except SessionRecordError as exc:
            logger.error("Cannot resume session %s: %s", _label(session_id), exc)
            return _error_response(f"Cannot resume session: {exc}", 500)
        except Exception as exc:  # not "unknown": the session may live on, so the client must retry, not drop it
            logger.error(
                "Session registry lookup failed for %s (%s); answering 503",
                _label(session_id),
                _scrubbed(exc, session_id),
            )
            return _error_response("The session registry cannot be read now; try again", 503)
        if record is None or record.terminated:
            logger.debug("Refusing session %s: unknown, expired or terminated", _label(session_id))
            return _session_not_found()
        if record.owner != requestor:
            return _refused_to_another(session_id)
        async with self._session_creation_lock:
            if session_id in self._server_instances:
                return None  # adopted by a concurrent request meanwhile
            if self.max_sessions is not None and len(self._server_instances) >= self.max_sessions:
                logger.warning(
                    "Refusing to adopt session %s: %d sessions are open", _label(session_id), self.max_sessions
                )
                return _error_response("Too many open sessions", 503)
            await self._start_adopted(record)
        # A termination may have landed between the read above and the adoption: read it again.
        transport = self._server_instances.get(session_id)
        return _session_not_found() if transport is None else await self._revalidate(session_id, transport, now=True)

    async def _start_adopted(self, record: SessionRecord) -> None:
        """Build the transport of an adopted session and start its server task (lock held: no waiting on I/O)."""
        session_id = record.session_id
        transport = StreamableHTTPServerTransport(
            mcp_session_id=session_id,
            is_json_response_enabled=self.json_response,
            event_store=self._events_for(session_id),
            security_settings=self.security_settings,
            retry_interval=self.retry_interval,
            idle_timeout=self.session_idle_timeout,
        )
        if record.owner is not None:
            self._session_owners[session_id] = cast(AuthorizationContext, record.owner)
        self._server_instances[session_id] = transport
        self._checked[session_id] = time.monotonic()
        self._digests[_digest(session_id)] = session_id
        client_params = _client_params(record)

        async def run_server(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            async with transport.connect() as (read_stream, write_stream):
                task_status.started()
                try:
                    with transport.idle_scope or anyio.CancelScope():
                        # What the SDK's serve_loop builds, with the handshake already done: the
                        # client completed it with the process that created the session.
                        dispatcher: JSONRPCDispatcher[TransportContext] = JSONRPCDispatcher(
                            read_stream, write_stream, inline_methods=frozenset({"initialize"})
                        )
                        connection = Connection.for_loop(
                            dispatcher, session_id=session_id, protocol_version_hint=record.protocol_version
                        )
                        connection.client_params = client_params
                        connection.initialized.set()
                        await serve_connection(
                            self.app, dispatcher, connection=connection, lifespan_state=self._lifespan_state
                        )
                except Exception:
                    logger.exception("Adopted session %s crashed", _label(session_id))
                finally:
                    await self._discard_session(session_id, transport)

        assert self._task_group is not None
        await self._task_group.start(run_server)
        logger.info("Adopted session %s from the session registry", _label(session_id))

    async def _revalidate(
        self, session_id: str, transport: StreamableHTTPServerTransport, *, now: bool = False
    ) -> Response | None:
        """Read the record before serving a request (a refresh instead, once per refresh interval or when
        ``now``); drop the session and return the refusal if it ended elsewhere.

        Every request reads it: a DELETE elsewhere has recorded its termination before it answered, so no
        request sent after that answer is served, whatever the signal channel has delivered yet.
        """
        last = self._checked.get(session_id)
        due = now or last is None or time.monotonic() - last >= self.registry.refresh_interval
        record = await (self._refresh(session_id) if due else self._read(session_id))
        if record is None or (record is not _GONE and not cast(SessionRecord, record).terminated):
            return None
        logger.info("Session %s was terminated or expired elsewhere; closing it here", _label(session_id))
        self._drop(session_id, transport)
        return _session_not_found()

    async def _read(self, session_id: str) -> SessionRecord | object | None:
        """Read the record: the record, ``_GONE`` when absent, None when the registry could not say."""
        try:
            record = await self.registry.get(session_id)
        except Exception as exc:
            logger.warning(
                "Could not read session %s in the session registry: %s", _label(session_id), _scrubbed(exc, session_id)
            )
            return None
        return _GONE if record is None else record

    async def _refresh(self, session_id: str) -> SessionRecord | object | None:
        """Touch the record: the record, ``_GONE`` when absent, None when the registry could not say."""
        self._checked[session_id] = time.monotonic()
        try:
            record = await self.registry.touch(session_id)
        except Exception as exc:
            logger.warning(
                "Could not refresh session %s in the session registry: %s",
                _label(session_id),
                _scrubbed(exc, session_id),
            )
            return None
        return _GONE if record is None else record

    # -- bookkeeping ---------------------------------------------------------------------

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        transport = super()._admit_session(requestor)
        if transport is not None and transport.mcp_session_id is not None:
            # The SDK built the transport without a store; give it this session's view.
            transport._event_store = self._events_for(transport.mcp_session_id)
            self._checked[transport.mcp_session_id] = time.monotonic()
            self._digests[_digest(transport.mcp_session_id)] = transport.mcp_session_id
        return transport

    async def _discard_session(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        if self._server_instances.get(session_id) in (transport, None):
            self._checked.pop(session_id, None)
            self._digests.pop(_digest(session_id), None)
        await super()._discard_session(session_id, transport)

    def _events_for(self, session_id: str) -> EventStore | None:
        if self.shared_event_store is None:
            return None
        if isinstance(self.shared_event_store, StoreEventStore):
            return _SessionEvents(self.shared_event_store, session_id, partial(self._cancel_request, session_id))
        return SessionScopedEventStore(self.shared_event_store, session_id)

    async def _cancel_request(self, session_id: str, request_id: str | int) -> None:
        """Cancel a request's handling here as the client's ``notifications/cancelled`` would: the event store
        gave it up (its lease lapsed, or another process answered it)."""
        transport = self._server_instances.get(session_id)
        writer = None if transport is None else transport._read_stream_writer
        if writer is None:
            return
        params = {"requestId": request_id, "reason": "this server's lease on the request lapsed"}
        note = JSONRPCNotification(jsonrpc="2.0", method="notifications/cancelled", params=params)
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await writer.send(SessionMessage(note))
        logger.info("Cancelled a request of session %s: its lease lapsed", _label(session_id))

    # -- termination everywhere ----------------------------------------------------------

    def _channel(self) -> SignalChannel | None:
        """The registry store's signal channel; None for a store without one (not one of kvstores' own)."""
        try:
            return signals_channel(self.registry.store)
        except TypeError:
            return None

    async def _watch_terminations(self) -> Callable[[], None]:
        """Drop held sessions as other processes end them; return what stops watching."""
        signals = self._channel()
        if signals is not None:
            try:
                return await signals.listen(TERMINATIONS, self._terminated_elsewhere, self._recheck_soon)
            except Exception as exc:
                logger.warning("Cannot listen for session terminations (%s); polling the registry instead", exc)
        if signals is not None or isinstance(self.registry.store, BaseStore):
            assert self._task_group is not None
            self._task_group.start_soon(self._poll_terminations)
        return lambda: None

    async def _close_channels(self) -> None:
        """Shut down: release the signal channels this manager used (another user gets a new one)."""
        stores: list[AsyncKeyValue] = [self.registry.store]
        if isinstance(self.shared_event_store, StoreEventStore):
            stores.append(self.shared_event_store.store)
        for store in stores:
            try:
                signals = signals_channel(store)
            except TypeError:
                continue
            with anyio.CancelScope(shield=True), anyio.move_on_after(_BOOKKEEPING_TIMEOUT):
                await signals.aclose()

    def _terminated_elsewhere(self, digest: str) -> None:
        """A DELETE somewhere ended the session named ``digest``: if it is held here, refuse it from now on."""
        session_id = self._digests.get(digest)
        transport = None if session_id is None else self._server_instances.get(session_id)
        if session_id is not None and transport is not None:
            logger.info("Session %s was terminated on another process; closing it here", _label(session_id))
            self._drop(session_id, transport)

    def _drop(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        """Forget the session now (the next request reads its record: 404); end its transport in the background."""
        self._server_instances.pop(session_id, None)
        self._session_owners.pop(session_id, None)
        if self._task_group is not None:
            self._task_group.start_soon(self._discard_session, session_id, transport)

    def _recheck_soon(self) -> None:
        """Termination signals may have been lost: read the records of the sessions held."""
        if self._task_group is not None:
            self._task_group.start_soon(self._recheck_held)

    async def _poll_terminations(self) -> None:
        while True:
            await anyio.sleep(_TERMINATION_POLL)
            await self._recheck_held()

    async def _recheck_held(self) -> None:
        """Drop each held session whose record is terminated or gone (one round trip per 500 sessions)."""
        held = list(self._server_instances)
        for start in range(0, len(held), _RECHECK_BATCH):
            batch = held[start : start + _RECHECK_BATCH]
            try:
                records = await self.registry.store.get_many(batch, collection=self.registry.collection)
            except Exception as exc:
                logger.warning("Could not check the sessions held against the session registry: %s", type(exc).__name__)
                return
            for session_id, stored in zip(batch, records):
                transport = self._server_instances.get(session_id)
                if transport is not None and (stored is None or stored.get("terminated") is True):
                    logger.info("Session %s was terminated or expired elsewhere; closing it here", _label(session_id))
                    self._drop(session_id, transport)

    async def _announce_termination(self, session_id: str) -> None:
        signals = self._channel()
        if signals is None:
            return
        try:
            with anyio.CancelScope(shield=True), anyio.fail_after(_BOOKKEEPING_TIMEOUT):
                await signals.publish(TERMINATIONS, _digest(session_id))
        except Exception as exc:
            logger.warning(
                "Could not announce the termination of session %s (%s); processes holding it refuse it "
                "after a signal gap or their next refresh",
                _label(session_id),
                _scrubbed(exc, session_id),
            )

    async def _register(self, session_id: str, owner: dict[str, Any] | None, handshake: dict[str, Any] | None) -> None:
        try:
            version = _negotiated_version(handshake)
            if not await self.registry.register(session_id, owner=owner, handshake=handshake, protocol_version=version):
                logger.error("Session id %s is already in the session registry; not recorded", _label(session_id))
        except Exception as exc:
            # A registry outage costs the session its durability, not its response.
            logger.error(
                "Could not record session %s in the session registry: %s",
                _label(session_id),
                _scrubbed(exc, session_id),
            )

    async def _record_termination(self, session_id: str, *, announce: bool = True) -> bool:
        """Record (and announce) that ``session_id`` ended; False (logged) when the registry could not record it."""
        try:
            with anyio.CancelScope(shield=True), anyio.fail_after(_BOOKKEEPING_TIMEOUT):
                await self.registry.terminate(session_id)
        except Exception as exc:
            logger.error(
                "Could not record the termination of session %s: %s", _label(session_id), _scrubbed(exc, session_id)
            )
            return False
        if announce:
            await self._announce_termination(session_id)
        return True

    async def close_sessions(self) -> None:
        """Shut down: end this process's transports gracefully, leaving every session adoptable."""
        self._closing = True
        for transport in list(self._server_instances.values()):
            try:
                await transport.terminate()
            except Exception:
                logger.debug("Error terminating a transport on shutdown", exc_info=True)


class _SessionEvents(EventStore):
    """A session's view of a shared :class:`StoreEventStore`: its streams only, followed live from any process.

    FastMCP's ``SessionScopedEventStore`` (same stream ids, so the two mix) holds a replay's
    events until the replay returns; this one checks the scope first and sends as it goes.
    """

    def __init__(
        self, events: StoreEventStore, session_id: str, cancel: Callable[[str | int], Awaitable[None]]
    ) -> None:
        self.events = events
        self.prefix = f"{len(session_id)}:{session_id}:"
        self.cancel = cancel

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        request_id = _sent_id(stream_id) if message is None and stream_id != GET_STREAM_KEY else None
        if request_id is None:
            return await self.events.store_event(self.prefix + stream_id, message)
        # The transport primes the stream of the request being posted: note its id as sent.
        on_fence = partial(self.cancel, request_id)
        return await self.events.append(self.prefix + stream_id, None, request_id=request_id, on_fence=on_fence)

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        scoped = await self.events.follow_events_after(last_event_id, send_callback, stream_prefix=self.prefix)
        return None if scoped is None else scoped[len(self.prefix) :]


_GONE = object()
"""What _refresh returns when the registry has no record of the session (expired or never written)."""


def _requestor(scope: Scope) -> dict[str, Any] | None:
    """The request's authorization context, compared exactly as the SDK compares it."""
    user = scope.get("user")
    return dict(authorization_context(user)) if isinstance(user, AuthenticatedUser) else None


def _client_params(record: SessionRecord) -> InitializeRequestParams | None:
    if record.handshake is None:
        return None
    try:
        return InitializeRequestParams.model_validate(record.handshake, by_name=False)
    except ValidationError:
        logger.warning("Recorded handshake of session %s is unreadable; adopting it without", _label(record.session_id))
        return None


def _initialize_params(body: bytes | bytearray) -> dict[str, Any] | None:
    """The params of the ``initialize`` request in an opening request body, if any."""
    if not body or len(body) > _MAX_HANDSHAKE_BYTES:
        return None
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    for message in payload if isinstance(payload, list) else [payload]:
        if isinstance(message, dict) and message.get("method") == "initialize":
            params = message.get("params")
            return params if isinstance(params, dict) else None
    return None


def _sent_id(stream_id: StreamId) -> str | int | None:
    """The JSON-RPC id, exactly as sent, of the request in the POST being handled whose stream is ``stream_id``.

    The SDK names a request's stream ``str(id)``, which loses the id's type (``"7"`` and ``7``)
    and leading zeros; the body says what the client sent.
    """
    body = _REQUEST_BODY.get()
    try:
        payload = json.loads(body) if body else None
    except ValueError:
        return None
    for message in payload if isinstance(payload, list) else [payload]:
        sent = message.get("id") if isinstance(message, dict) and "method" in message else None
        if isinstance(sent, (str, int)) and not isinstance(sent, bool) and str(sent) == stream_id:
            return sent
    return None


def _response_session_id(message: Message) -> str | None:
    """The ``Mcp-Session-Id`` a response start message carries, if any."""
    header = MCP_SESSION_ID_HEADER.lower().encode("latin-1")
    for name, value in message.get("headers", ()):
        if name.lower() == header:
            return cast(bytes, value).decode("latin-1")
    return None


def _refused_to_another(session_id: str) -> Response:
    """The 404 for a session that exists but was opened with other credentials (as if it did not exist)."""
    logger.warning("Refusing session %s: credential does not match its creator's", _label(session_id))
    return _session_not_found()


def _session_not_found() -> Response:
    """The SDK's own answer to an unknown session id, byte for byte."""
    return _error_response("Session not found", 404, INVALID_REQUEST)


def _error_response(message: str, status_code: int, code: int = INTERNAL_ERROR) -> Response:
    """A JSON-RPC error without request id, as the SDK's session manager sends its own."""
    body = JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=code, message=message))
    return Response(
        body.model_dump_json(by_alias=True, exclude_unset=True), status_code=status_code, media_type="application/json"
    )


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
