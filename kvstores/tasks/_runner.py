"""Running a claimed task's FastMCP tool in a worker, as the submitting caller.

What ``fastmcp-tasks`` 4.1.4 does in a Docket worker (its ``context.py`` and ``input_loop.py``),
without Docket: the caller's access token, HTTP headers and session id are restored into the
context variables ``get_access_token()``, ``get_http_headers()`` and ``ctx.session_id`` read (a
token that expired while the task waited is not installed, as a live request would reject it);
a worker ``Context`` carries the task id and, on a re-entered run, the client's answers
(``ctx.input_responses``) and the tool's carried ``request_state``. The tool run is the component
``server.get_tasks()`` registered under the called tool's key (for a mounted tool, the child's own
tool: no mounted server's middleware runs around it again, the root's wrapped the submission), and
its context's server is the server the tool lives on. An error raised by the tool's body becomes a
*completed* task whose result has ``isError`` (masked per the server's policy), an ``MCPError`` a
*failed* one with its JSON-RPC error, and anything that fails around a function tool's body (a
dependency that cannot be resolved) a *failed* one with -32603, as Docket's dependency injection
does; an ``InputRequiredResult`` parks the task in ``input_required``. ``Progress`` writes through
to the task record (:class:`StoreProgress`).
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import mcp_types
from mcp.shared.exceptions import MCPError

from kvstores.tasks._engine import Claim, TaskEngine
from kvstores.tasks._progress import ProgressRecorder, TaskContext, with_store_progress
from kvstores.tasks._record import TaskRecord, TaskState, label
from kvstores.tasks._worker import Outcome

if TYPE_CHECKING:
    from fastmcp import FastMCP
    from fastmcp.tools.base import Tool

__all__ = ["checked_answer", "execute", "owning_server", "registered_component"]

logger = logging.getLogger("kvstores.tasks")

_RESULT_TYPES: dict[str, type[Any]] = {
    "elicitation/create": mcp_types.ElicitResult,
    "sampling/createMessage": mcp_types.CreateMessageResult,
    "roots/list": mcp_types.ListRootsResult,
}


async def execute(server: FastMCP, claim: Claim, engine: TaskEngine) -> Outcome:
    """Run the tool of ``claim`` on ``server`` and say how it ended."""
    from fastmcp.exceptions import FastMCPError, NotFoundError
    from fastmcp.tools.base import InputRequiredToolResult
    from fastmcp.utilities.versions import VersionSpec

    record = claim.record
    version = record.version
    try:
        called = await server.get_tool(record.tool, VersionSpec(eq=version) if version else None)
    except NotFoundError:
        called = None
    if called is None:
        return _failed(f"tool {record.tool!r} is not served by this worker's server")
    tool = await registered_component(server, called)
    owner = owning_server(called, server)
    caller: Mapping[str, Any] = record.caller
    _restore_caller(caller)
    recorder = ProgressRecorder(engine, claim)
    ctx = TaskContext(fastmcp=owner, task_id=claim.task_id, origin_request_id=caller.get("origin_request_id"))
    ctx.recorder = recorder
    fn = getattr(tool, "fn", None)
    if fn is not None:
        marked = _body_marked(fn)
        progressing = with_store_progress(marked, recorder) if inspect.iscoroutinefunction(fn) else None
        tool = tool.model_copy(update={"fn": progressing or marked})
    ctx._task_input_responses = _typed_responses(record.input_responses)
    ctx._task_request_state = record.request_state
    try:
        async with ctx:
            result = await tool.run(dict(record.arguments))
    except MCPError as exc:
        error: dict[str, Any] = {"code": exc.error.code, "message": exc.error.message}
        if exc.error.data is not None:
            error["data"] = exc.error.data
        return Outcome(TaskState.FAILED, {"error": error, "message": exc.error.message})
    except Exception as exc:
        raised = exc.error if isinstance(exc, _BodyError) else exc
        if fn is not None and raised is exc:  # around the body: a dependency, as Docket fails it
            logger.exception("tasks: task %s failed before its tool ran", label(claim.task_ref))
            return _failed(str(exc) or type(exc).__name__)
        if isinstance(raised, FastMCPError):
            return _tool_error(str(raised))
        logger.exception("tasks: the tool of task %s raised", label(claim.task_ref))
        masked = getattr(owner, "_mask_error_details", False)
        return _tool_error(f"Error calling tool {tool.name!r}" + ("" if masked else f": {raised}"))
    if isinstance(result, InputRequiredToolResult):
        return _parked(result.input_required, record)
    return Outcome(TaskState.COMPLETED, {"result": _call_tool_result(tool, result), "message": None})


async def registered_component(server: FastMCP, tool: Tool) -> Tool:
    """The component ``server.get_tasks()`` registered under ``tool``'s key (as ``fastmcp-tasks`` runs it).

    For a mounted tool, ``get_tool()`` answers a provider wrapper whose ``run`` calls the child server
    (its middleware again); the registered component is the child's own tool, transforms applied.
    """
    from fastmcp.tools.base import Tool

    for component in await server.get_tasks():
        if component.key == tool.key and isinstance(component, Tool):
            return component
    return tool


def owning_server(tool: Tool, fallback: FastMCP) -> FastMCP:
    """The server a mounted tool lives on (its context's ``fastmcp``, ``CurrentFastMCP()``), else ``fallback``."""
    from fastmcp.server.providers.fastmcp_provider import FastMCPProviderTool

    if isinstance(tool, FastMCPProviderTool) and tool._server is not None:
        return cast("FastMCP", tool._server)
    return fallback


class _BodyError(Exception):
    """What a function tool's own body raised, told apart from a failure around it (its dependencies)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _body_marked(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (same signature) raising :class:`_BodyError` for what its body raises; ``MCPError`` passes."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def marked(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except MCPError:
                raise
            except Exception as exc:
                raise _BodyError(exc) from exc

        return marked

    @functools.wraps(fn)
    def marked_sync(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MCPError:
            raise
        except Exception as exc:
            raise _BodyError(exc) from exc

    return marked_sync


def _restore_caller(caller: Mapping[str, Any]) -> None:
    """Install the submitting caller's token, headers and session id for the tool (this task's context only)."""
    from fastmcp.server.auth import AccessToken
    from fastmcp.server.dependencies import _background_task_headers, _background_task_session_id
    from mcp.server.auth.middleware.auth_context import auth_context_var
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser

    user = None
    token_json = caller.get("access_token")
    if token_json is not None:
        token = AccessToken.model_validate_json(token_json)
        if token.expires_at is None or token.expires_at >= int(time.time()):
            user = AuthenticatedUser(token)
    auth_context_var.set(user)
    headers = caller.get("headers")
    _background_task_headers.set(dict(headers) if headers else None)
    _background_task_session_id.set(caller.get("session_id"))


def checked_answer(method: str | None, answer: Any) -> Any:
    """A client's answer to a request of ``method``, validated and as stored; MCPError -32602 when invalid."""
    from pydantic import ValidationError

    kind = _RESULT_TYPES.get(method or "elicitation/create", mcp_types.ElicitResult)
    try:
        dumped = kind.model_validate(answer).model_dump(by_alias=True, mode="json", exclude_none=True)
    except ValidationError as exc:
        raise MCPError(code=mcp_types.INVALID_PARAMS, message=f"an input response is not a {kind.__name__}") from exc
    return dumped


def _typed_responses(stored: Mapping[str, Any] | None) -> mcp_types.InputResponses | None:
    if not stored:
        return None
    responses: dict[str, Any] = {}
    for key, entry in stored.items():
        kind = _RESULT_TYPES.get(entry.get("method") or "elicitation/create", mcp_types.ElicitResult)
        responses[key] = kind.model_validate(entry.get("result"))
    return responses


def _parked(asked: mcp_types.InputRequiredResult, record: TaskRecord) -> Outcome:
    """The task waits for the client's answers: each request under a key no earlier round used."""
    requests = asked.input_requests or {}
    if not requests:  # fastmcp-tasks' words where the round carries state
        asks = "an InputRequiredResult that asks nothing"
        if asked.request_state is not None:
            asks = "a state-only InputRequiredResult (request_state with no input_requests)"
        return _tool_error(
            f"A background task returned {asks}. "
            "Checkpoint-style rounds that carry state without asking the client anything are not yet supported for "
            "tasks; include at least one input request, or run the tool synchronously."
        )
    round_number = record.attempts
    surfaced = {f"{key}@{round_number}": key for key in requests}
    dumped = {
        shown: requests[key].model_dump(by_alias=True, mode="json", exclude_none=True)
        for shown, key in surfaced.items()
    }
    return Outcome(
        TaskState.INPUT_REQUIRED,
        {"input_requests": dumped, "input_keys": surfaced, "request_state": asked.request_state, "message": None},
    )


def _call_tool_result(tool: Tool, result: Any) -> dict[str, Any]:
    mcp_result = result.to_mcp_result()
    if isinstance(mcp_result, mcp_types.CallToolResult):
        call = mcp_result
    elif isinstance(mcp_result, tuple):
        content, structured = mcp_result
        call = mcp_types.CallToolResult(content=content, structured_content=structured)
    else:
        call = mcp_types.CallToolResult(content=mcp_result)
    dumped: dict[str, Any] = call.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def _tool_error(text: str) -> Outcome:
    result = mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=text)], is_error=True)
    return Outcome(TaskState.COMPLETED, {"result": result.model_dump(by_alias=True, mode="json", exclude_none=True)})


def _failed(message: str) -> Outcome:
    return Outcome(
        TaskState.FAILED, {"error": {"code": mcp_types.INTERNAL_ERROR, "message": message}, "message": message}
    )
