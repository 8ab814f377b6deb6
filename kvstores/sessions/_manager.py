"""The durable session manager: the SDK's, plus a registry, adoption, termination everywhere and scoped events.

See :mod:`kvstores.sessions` for what survives and what it costs; each concern has a module of its own:
records in :mod:`~kvstores.sessions._registry`, adoption in :mod:`~kvstores.sessions._adoption`,
terminations in :mod:`~kvstores.sessions._terminations`, event views in
:mod:`~kvstores.sessions._session_events`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import anyio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, AuthorizationContext, authorization_context
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, EventStore, StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION
from starlette.requests import Request
from starlette.responses import Response

from kvstores.events import StoreEventStore
from kvstores.sessions._adoption import adoptable, serve_adopted
from kvstores.sessions._registry import SessionRecord, SessionRegistry, label, scrubbed
from kvstores.sessions._replies import error_response, refused_to_another, session_not_found
from kvstores.sessions._session_events import REQUEST_BODY, events_for
from kvstores.sessions._terminations import BOOKKEEPING_TIMEOUT, Terminations
from kvstores.signals import channel as signals_channel

if TYPE_CHECKING:
    from starlette.types import Message, Receive, Scope, Send

    from kvstores.protocol import AsyncKeyValue

__all__ = ["DurableSessionManager"]

logger = logging.getLogger("kvstores.sessions")  # the public name, whatever module logs

_MAX_HANDSHAKE_BYTES = 64 * 1024
"""An opening request body larger than this is not read for its handshake; its session is recorded without."""

_SDK_SESSION_ID = re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{32}(?![0-9A-Za-z])")
"""A session id as the SDK makes them (``uuid4().hex``), in a line of its log."""


class _SessionIdRedaction(logging.Filter):
    """Replaces the session ids in the SDK session manager's log lines (it logs them whole) by their labels."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _SDK_SESSION_ID.sub(lambda found: label(found[0]), message)
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
        self._terminations = Terminations(registry, self._server_instances, self._drop)
        self._closing = False

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """The SDK manager's ``run()``, also refusing at once the sessions a DELETE ends on another process."""
        try:
            async with super().run():
                assert self._task_group is not None
                stop = await self._terminations.watch(self._task_group)
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

        kept = REQUEST_BODY.set(body)
        try:
            await self._handle_session_request(scope, receive_keeping_body, send)
        finally:
            REQUEST_BODY.reset(kept)

    async def _handle_session_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        session_id = Request(scope).headers.get(MCP_SESSION_ID_HEADER)
        if session_id is None:
            await self._open_session(scope, receive, send)
            return
        requestor = _requestor(scope)
        refusal: Response | None
        if session_id not in self._server_instances:
            refusal = await self._adopt(session_id, requestor)
        elif requestor != self._session_owners.get(session_id):
            refusal = refused_to_another(session_id)  # what the SDK answers, without logging the id
        else:
            refusal = session_not_found() if await self._terminations.ended(session_id) else None
        deleting = refusal is None and scope["method"] == "DELETE"
        if deleting and not await self._terminations.record(session_id, announce=False):
            refusal = error_response("Could not record the session's termination; the session goes on", 503)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        try:
            await super()._handle_stateful_request(scope, receive, send)
        finally:
            if deleting:  # announced once the SDK ended it here: its own echo must not beat the DELETE to it
                await self._terminations.announce(session_id)

    async def _open_session(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Let the SDK open a session; record it before the response hands the client its id."""
        requestor = _requestor(scope)
        opened: list[str] = []

        async def send_after_registering(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400 and not opened:
                new_id = _response_session_id(message)
                if new_id is not None and new_id in self._server_instances:
                    opened.append(new_id)
                    await self._register(new_id, requestor, _initialize_params(REQUEST_BODY.get() or b""))
            await send(message)

        try:
            await super()._handle_stateful_request(scope, receive, send_after_registering)
        finally:
            # The SDK drops a session whose opening request failed or was cancelled after its
            # response started; the client may hold its id, so no other process may adopt it.
            for sid in opened:
                if sid not in self._server_instances and not self._closing:
                    await self._terminations.record(sid)

    async def _adopt(self, session_id: str, requestor: dict[str, Any] | None) -> Response | None:
        """Serve a registered session here; return the response that refuses it instead (None: serve it)."""
        record = await adoptable(self.registry, session_id, requestor)
        if isinstance(record, Response):
            return record
        async with self._session_creation_lock:
            if session_id in self._server_instances:
                return None  # adopted by a concurrent request meanwhile
            if self.max_sessions is not None and len(self._server_instances) >= self.max_sessions:
                logger.warning(
                    "Refusing to adopt session %s: %d sessions are open", label(session_id), self.max_sessions
                )
                return error_response("Too many open sessions", 503)
            await self._start_adopted(record)
        # A termination may have landed between the read above and the adoption: read it again.
        if session_id not in self._server_instances or await self._terminations.ended(session_id, adopted=True):
            return session_not_found()
        return None

    async def _start_adopted(self, record: SessionRecord) -> None:
        """Build the transport of an adopted session and start its server task (lock held: no waiting on I/O)."""
        session_id = record.session_id
        transport = StreamableHTTPServerTransport(
            mcp_session_id=session_id,
            is_json_response_enabled=self.json_response,
            event_store=events_for(self.shared_event_store, session_id, self._server_instances),
            security_settings=self.security_settings,
            retry_interval=self.retry_interval,
            idle_timeout=self.session_idle_timeout,
        )
        if record.owner is not None:
            self._session_owners[session_id] = cast(AuthorizationContext, record.owner)
        self._server_instances[session_id] = transport
        self._terminations.hold(session_id)
        assert self._task_group is not None
        serve = partial(serve_adopted, self.app, self._lifespan_state, transport, record, self._discard_session)
        await self._task_group.start(serve)
        logger.info("Adopted session %s from the session registry", label(session_id))

    # -- bookkeeping ---------------------------------------------------------------------

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        transport = super()._admit_session(requestor)
        if transport is not None and transport.mcp_session_id is not None:
            # The SDK built the transport without a store; give it this session's view.
            session_id = transport.mcp_session_id
            transport._event_store = events_for(self.shared_event_store, session_id, self._server_instances)
            self._terminations.hold(session_id)
        return transport

    async def _discard_session(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        if self._server_instances.get(session_id) in (transport, None):
            self._terminations.release(session_id)
        await super()._discard_session(session_id, transport)

    def _drop(self, session_id: str) -> None:
        """Forget the session now (the next request reads its record: 404); end its transport in the background."""
        transport = self._server_instances.pop(session_id, None)
        self._session_owners.pop(session_id, None)
        if transport is not None and self._task_group is not None:
            self._task_group.start_soon(self._discard_session, session_id, transport)

    async def _register(self, session_id: str, owner: dict[str, Any] | None, handshake: dict[str, Any] | None) -> None:
        try:
            version = _negotiated_version(handshake)
            if not await self.registry.register(session_id, owner=owner, handshake=handshake, protocol_version=version):
                logger.error("Session id %s is already in the session registry; not recorded", label(session_id))
        except Exception as exc:
            # A registry outage costs the session its durability, not its response.
            logger.error(
                "Could not record session %s in the session registry: %s", label(session_id), scrubbed(exc, session_id)
            )

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
            with anyio.CancelScope(shield=True), anyio.move_on_after(BOOKKEEPING_TIMEOUT):
                await signals.aclose()

    async def close_sessions(self) -> None:
        """Shut down: end this process's transports gracefully, leaving every session adoptable."""
        self._closing = True
        for transport in list(self._server_instances.values()):
            try:
                await transport.terminate()
            except Exception:
                logger.debug("Error terminating a transport on shutdown", exc_info=True)


def _requestor(scope: Scope) -> dict[str, Any] | None:
    """The request's authorization context, compared exactly as the SDK compares it."""
    user = scope.get("user")
    return dict(authorization_context(user)) if isinstance(user, AuthenticatedUser) else None


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


def _response_session_id(message: Message) -> str | None:
    """The ``Mcp-Session-Id`` a response start message carries, if any."""
    header = MCP_SESSION_ID_HEADER.lower().encode("latin-1")
    for name, value in message.get("headers", ()):
        if name.lower() == header:
            return cast(bytes, value).decode("latin-1")
    return None
