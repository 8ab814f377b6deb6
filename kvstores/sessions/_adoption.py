"""Adoption: serving here a session another process (or this one, before a restart) opened.

:func:`adoptable` decides from the registry record whether a request may adopt the session;
:func:`serve_adopted` runs the adopted session's server as the SDK's serve loop would, with the
handshake its creator completed already done.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.connection import Connection
from mcp.server.runner import serve_connection
from mcp.server.streamable_http import SESSION_ID_PATTERN, StreamableHTTPServerTransport
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.transport_context import TransportContext
from mcp_types import InitializeRequestParams
from pydantic import ValidationError
from starlette.responses import Response

from kvstores.sessions._registry import SessionRecord, SessionRecordError, SessionRegistry, label, scrubbed
from kvstores.sessions._replies import error_response, refused_to_another, session_not_found

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

__all__ = ["adoptable", "serve_adopted"]

logger = logging.getLogger("kvstores.sessions")  # the public name, whatever module logs

_MAX_SESSION_ID_LENGTH = 256
"""Longer ids are never looked up (the SDK's own are 32 characters)."""


async def adoptable(
    registry: SessionRegistry, session_id: str, requestor: dict[str, Any] | None
) -> SessionRecord | Response:
    """The record of a session ``requestor`` may adopt, or the response that refuses it."""
    if len(session_id) > _MAX_SESSION_ID_LENGTH or not SESSION_ID_PATTERN.fullmatch(session_id):
        return session_not_found()
    try:
        record = await registry.get(session_id)
    except SessionRecordError as exc:
        logger.error("Cannot resume session %s: %s", label(session_id), exc)
        return error_response(f"Cannot resume session: {exc}", 500)
    except Exception as exc:  # not "unknown": the session may live on, so the client must retry, not drop it
        logger.error(
            "Session registry lookup failed for %s (%s); answering 503", label(session_id), scrubbed(exc, session_id)
        )
        return error_response("The session registry cannot be read now; try again", 503)
    if record is None or record.terminated:
        logger.debug("Refusing session %s: unknown, expired or terminated", label(session_id))
        return session_not_found()
    if record.owner != requestor:
        return refused_to_another(session_id)
    return record


async def serve_adopted(
    server: Any,
    lifespan_state: Any,
    transport: StreamableHTTPServerTransport,
    record: SessionRecord,
    discard: Callable[[str, StreamableHTTPServerTransport], Awaitable[None]],
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the adopted session of ``record`` on ``transport`` with the low-level ``server`` until it ends,
    then ``discard`` it; started with ``TaskGroup.start`` (ready once the transport is connected)."""
    session_id = record.session_id
    client_params = _client_params(record)
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
                await serve_connection(server, dispatcher, connection=connection, lifespan_state=lifespan_state)
        except Exception:
            logger.exception("Adopted session %s crashed", label(session_id))
        finally:
            await discard(session_id, transport)


def _client_params(record: SessionRecord) -> InitializeRequestParams | None:
    if record.handshake is None:
        return None
    try:
        return InitializeRequestParams.model_validate(record.handshake, by_name=False)
    except ValidationError:
        logger.warning("Recorded handshake of session %s is unreadable; adopting it without", label(record.session_id))
        return None
