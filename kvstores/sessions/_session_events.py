"""Each session's view of the shared event store: its own streams only, followed live from any process."""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from functools import partial

import anyio
from fastmcp.server.session_scoped_event_store import SessionScopedEventStore
from mcp.server.streamable_http import (
    GET_STREAM_KEY,
    EventCallback,
    EventId,
    EventStore,
    StreamableHTTPServerTransport,
    StreamId,
)
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCMessage, JSONRPCNotification

from kvstores.events import StoreEventStore
from kvstores.sessions._registry import label

__all__ = ["REQUEST_BODY", "SessionEvents", "events_for"]

logger = logging.getLogger("kvstores.sessions")  # the public name, whatever module logs

REQUEST_BODY: contextvars.ContextVar[bytearray | None] = contextvars.ContextVar("kvstores_request_body", default=None)
"""The body of the POST being handled, as received: read (parsed) only when the transport primes a request stream."""


def events_for(
    shared: EventStore | None, session_id: str, held: Mapping[str, StreamableHTTPServerTransport]
) -> EventStore | None:
    """The view of ``shared`` a session's transport gets (``held``: the transports served here, by session id)."""
    if shared is None:
        return None
    if isinstance(shared, StoreEventStore):
        return SessionEvents(shared, session_id, partial(_cancel_request, held, session_id))
    return SessionScopedEventStore(shared, session_id)


class SessionEvents(EventStore):
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
        """Store an event of this session's stream ``stream_id``."""
        request_id = _sent_id(stream_id) if message is None and stream_id != GET_STREAM_KEY else None
        if request_id is None:
            return await self.events.store_event(self.prefix + stream_id, message)
        # The transport primes the stream of the request being posted: note its id as sent.
        on_fence = partial(self.cancel, request_id)
        return await self.events.append(self.prefix + stream_id, None, request_id=request_id, on_fence=on_fence)

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        """Replay (and follow, live) this session's events after ``last_event_id``."""
        scoped = await self.events.follow_events_after(last_event_id, send_callback, stream_prefix=self.prefix)
        return None if scoped is None else scoped[len(self.prefix) :]


async def _cancel_request(
    held: Mapping[str, StreamableHTTPServerTransport], session_id: str, request_id: str | int
) -> None:
    """Cancel a request's handling here as the client's ``notifications/cancelled`` would: the event store
    gave it up (its lease lapsed, or another process answered it)."""
    transport = held.get(session_id)
    writer = None if transport is None else transport._read_stream_writer
    if writer is None:
        return
    params = {"requestId": request_id, "reason": "this server's lease on the request lapsed"}
    note = JSONRPCNotification(jsonrpc="2.0", method="notifications/cancelled", params=params)
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        await writer.send(SessionMessage(note))
    logger.info("Cancelled a request of session %s: its lease lapsed", label(session_id))


def _sent_id(stream_id: StreamId) -> str | int | None:
    """The JSON-RPC id, exactly as sent, of the request in the POST being handled whose stream is ``stream_id``.

    The SDK names a request's stream ``str(id)``, which loses the id's type (``"7"`` and ``7``)
    and leading zeros; the body says what the client sent.
    """
    body = REQUEST_BODY.get()
    try:
        payload = json.loads(body) if body else None
    except ValueError:
        return None
    for message in payload if isinstance(payload, list) else [payload]:
        sent = message.get("id") if isinstance(message, dict) and "method" in message else None
        if isinstance(sent, (str, int)) and not isinstance(sent, bool) and str(sent) == stream_id:
            return sent
    return None
