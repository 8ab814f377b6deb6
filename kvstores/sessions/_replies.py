"""The answers durable sessions give instead of serving a request: the SDK's own, byte for byte, never naming the id."""

from __future__ import annotations

import logging

from mcp_types import INTERNAL_ERROR, INVALID_REQUEST, ErrorData, JSONRPCError
from starlette.responses import Response

from kvstores.sessions._registry import label

logger = logging.getLogger("kvstores.sessions")  # the public name, whatever module logs


def refused_to_another(session_id: str) -> Response:
    """The 404 for a session that exists but was opened with other credentials (as if it did not exist)."""
    logger.warning("Refusing session %s: credential does not match its creator's", label(session_id))
    return session_not_found()


def session_not_found() -> Response:
    """The SDK's own answer to an unknown session id, byte for byte."""
    return error_response("Session not found", 404, INVALID_REQUEST)


def error_response(message: str, status_code: int, code: int = INTERNAL_ERROR) -> Response:
    """A JSON-RPC error without request id, as the SDK's session manager sends its own."""
    body = JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=code, message=message))
    return Response(
        body.model_dump_json(by_alias=True, exclude_unset=True), status_code=status_code, media_type="application/json"
    )
