"""``StoreTasks``: the FastMCP server extension ``io.modelcontextprotocol/tasks`` on a kvstores store.

In place of ``fastmcp_tasks.TasksExtension``: the same capability, methods (``tasks/get``,
``tasks/update``, ``tasks/cancel``), ``tools/call`` interception and answers, with the engine
on any kvstores store with atomic operations (:mod:`kvstores.tasks._engine`) instead of Docket,
and a worker in every server process (its lifespan). Where the extension's behaviour is not
spelled out, this does what ``fastmcp-tasks`` 4.1.4 does (its ``extension.py``, ``creation.py``
and ``handlers.py``): the gates of every ``tasks/*`` method, the modes, arguments validated at
``tools/call`` (the server's ``strict_input_validation`` honoured; an invalid call raises there
and creates no task), the -32602 "Task <id> not found" for a missing, expired or another
principal's task, the empty acknowledgement of a cancel of a finished task, and the principal
(``client_id|sub`` of the access token, None for an anonymous caller). ``fastmcp-tasks``'
``FASTMCP_TASKS_ENCRYPTION_KEY`` is refused, not ignored: records are sealed by the store's own
``encryption_keys``.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import AsyncGenerator, Collection, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Self, cast

from fastmcp.server.extensions import MethodBinding, ServerExtension, read_client_extension_settings
from fastmcp.utilities.tasks import TASKS_EXTENSION_ID
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from kvstores.errors import KVStoreError
from kvstores.loop import stop, wait_event
from kvstores.signals import channel as signals_channel
from kvstores.tasks._book import logger
from kvstores.tasks._engine import DEFAULT_LEASE, DEFAULT_TTL, SIGNALS, Claim, TaskEngine, iso, ref
from kvstores.tasks._models import (
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CancelTaskResult,
    CreateTaskResult,
    GetTaskParams,
    GetTaskResult,
    UpdateTaskParams,
    UpdateTaskResult,
    missing_capability_error_data,
)
from kvstores.tasks._record import TaskRecord, TaskState
from kvstores.tasks._worker import DEFAULT_CONCURRENCY, DEFAULT_RESCAN, Worker

if TYPE_CHECKING:
    import mcp_types
    from fastmcp.server.context import Context
    from fastmcp.server.extensions import ToolCallContinuation, ToolCallOutcome
    from mcp.server.context import ServerRequestContext

__all__ = ["StoreTasks", "serve_worker"]

_TASK_METHOD_VERSIONS = frozenset(MODERN_PROTOCOL_VERSIONS)

DEFAULT_HOLD = 0.1
"""Seconds a ``tasks/get`` of a running task waits for it to end: a quick tool's first poll finds it done."""


class StoreTasks(ServerExtension):
    """Background tasks for ``@mcp.tool(task=True)``, kept on ``store``: ``mcp.add_extension(StoreTasks(store))``.

    Options: ``concurrency`` (tasks this process runs at once), ``lease`` (seconds a claim lasts
    without a heartbeat: a task whose worker died runs again within ``lease + rescan``, 12.5 s
    by default), ``rescan`` (seconds between two safety rescans of the queue; signals wake
    workers at once), ``ttl`` (seconds a task is kept after its last change, reported as
    ``ttlMs``), ``run_once`` (names of tools never run twice: a task whose worker died fails
    instead), ``worker`` (False: this process serves tasks/* but runs none; ``kvstores
    worker`` processes do) and ``hold`` (seconds a ``tasks/get`` of a running task waits for it to
    end before it answers "working", at most the task's ``pollIntervalMs``; woken at once when the
    task ends on any replica, :mod:`kvstores.tasks._changes`; 0: answer at once, as ``fastmcp-tasks``).

    ``FASTMCP_TASKS_ENCRYPTION_KEY`` (``fastmcp-tasks``' key for its context snapshots, in the
    environment or the ``.env`` file FastMCP reads) raises ValueError: nothing here reads it, and a
    server migrated from ``fastmcp-tasks`` must not run believing its tasks are encrypted. Seal them
    with ``open_store(url, encryption_keys=[...])`` and unset the variable.
    """

    identifier = TASKS_EXTENSION_ID

    def __init__(
        self,
        store: Any,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        lease: float = DEFAULT_LEASE,
        rescan: float = DEFAULT_RESCAN,
        ttl: float = DEFAULT_TTL,
        run_once: Collection[str] = (),
        worker: bool = True,
        hold: float = DEFAULT_HOLD,
    ) -> None:
        _refuse_fastmcp_tasks_key()
        if isinstance(hold, bool) or not isinstance(hold, (int, float)) or not 0 <= hold <= 60:
            raise ValueError(f"hold must be a number of seconds in [0, 60], not {hold!r}")
        self.engine = TaskEngine(store, lease=lease, ttl=ttl)
        self.hold = float(hold)
        self.concurrency = concurrency
        self.rescan = rescan
        self.run_once = frozenset(run_once)
        self.run_worker = worker
        Worker(self.engine, _never, concurrency=concurrency, rescan=rescan)  # the options' checks, now
        self._local: Worker | None = None  # this process's worker while the server runs

    def clone(self) -> Self:
        """An unbound copy on the same store (a store cannot be deep-copied)."""
        copy = type(self).__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy._server_ref = None
        copy._local = None
        return copy

    def methods(self) -> Sequence[MethodBinding]:
        """``tasks/get``, ``tasks/update`` and ``tasks/cancel``, at the protocol versions that have them."""
        return [
            MethodBinding("tasks/get", GetTaskParams, self._handle_get, _TASK_METHOD_VERSIONS),
            MethodBinding("tasks/update", UpdateTaskParams, self._handle_update, _TASK_METHOD_VERSIONS),
            MethodBinding("tasks/cancel", GetTaskParams, self._handle_cancel, _TASK_METHOD_VERSIONS),
        ]

    @asynccontextmanager
    async def lifespan(self) -> AsyncGenerator[None, None]:
        """Run this process's worker while the server runs, and hear the ends of tasks that held reads wait for."""
        changes = self.engine.changes
        unsubscribe = None
        if self.hold > 0:
            try:
                unsubscribe = await signals_channel(self.engine.store).listen(
                    SIGNALS, changes.on_message, changes.on_gap
                )
            except (KVStoreError, TypeError, OSError) as exc:  # held reads then wake for this process's runs only
                logger.warning("tasks: no signal channel (%s); tasks/get waits for runs of this process only", exc)
        task = None
        if self.run_worker:
            self._local = worker = self.worker()
            task = asyncio.get_running_loop().create_task(worker.run())
        try:
            yield
        finally:
            self._local = None
            if task is not None:
                await stop(task)  # its subscription to the signal channel ends with it
            if unsubscribe is not None:
                unsubscribe()

    def worker(self) -> Worker:
        """A worker that runs this server's tasks (the lifespan runs one; ``kvstores worker`` too)."""
        from kvstores.tasks._runner import execute

        server = self.server

        async def run(claim: Any, engine: TaskEngine) -> Any:
            return await execute(server, claim, engine)

        return Worker(self.engine, run, concurrency=self.concurrency, rescan=self.rescan)

    # -- tools/call ------------------------------------------------------------------

    async def intercept_tool_call(
        self, params: mcp_types.CallToolRequestParams, context: Context, call_next: ToolCallContinuation
    ) -> ToolCallOutcome:
        """Run this call as a task when the tool's mode and the client's opt-in say so (as ``fastmcp-tasks``)."""
        from fastmcp.exceptions import NotFoundError, ToolError
        from fastmcp.server.dependencies import _is_client_tool_call, extract_version_spec
        from fastmcp.utilities.versions import VersionSpec

        from_client = _is_client_tool_call()
        version_text = extract_version_spec(cast(dict[str, Any] | None, params.meta))
        try:
            tool = await context.fastmcp.get_tool(params.name, VersionSpec(eq=version_text) if version_text else None)
        except NotFoundError:
            tool = None
        if tool is None or not tool.task_config.supports_tasks():
            return await call_next()
        request = context.request_context
        modern = request is not None and request.protocol_version in MODERN_PROTOCOL_VERSIONS
        opted_in = modern and context.client_extension_settings(TASKS_EXTENSION_ID) is not None
        mode = tool.task_config.mode
        if not from_client:
            if mode == "required":
                raise ToolError(
                    f"Tool {tool.name!r} only runs as a background task, which the client has to request "
                    "by calling it directly."
                )
            return await call_next()
        if mode == "required" and not opted_in:
            raise MCPError(
                code=MISSING_REQUIRED_CLIENT_CAPABILITY,
                message=f"Tool {tool.name!r} requires the tasks extension ({TASKS_EXTENSION_ID}); "
                "the client did not declare it for this request.",
                data=missing_capability_error_data(),
            )
        if not opted_in:
            return await call_next()
        return await self._create(tool, params.arguments or {}, context, tool.task_config.poll_interval)

    async def _create(
        self, tool: Any, arguments: dict[str, Any], context: Context, poll: timedelta
    ) -> CreateTaskResult:
        from kvstores.tasks._runner import registered_component

        _validate(await registered_component(context.fastmcp, tool), arguments, context.fastmcp.strict_input_validation)
        caller = _caller(context)
        local = self._local
        here = local is not None and local.reserve()  # a free slot here runs it, claimed as it is written
        try:
            record = await self.engine.submit(
                tool=tool.name,
                version=None if tool.version is None else str(tool.version),
                arguments=arguments,
                scope=_scope(),
                caller=caller,
                poll_interval_ms=int(poll.total_seconds() * 1000),
                rerun=tool.name not in self.run_once,
                claim=here,
            )
        except BaseException as exc:
            if here and local is not None:
                local.unreserve()
            if isinstance(exc, KVStoreError):
                raise MCPError(
                    code=INTERNAL_ERROR, message=f"the task could not be stored, so it was not created: {exc}"
                ) from exc
            raise
        if here and local is not None:
            local.run_claimed(Claim(record, record.token))
        elif local is not None:
            local.offer(record.ref)  # a slot that frees here takes it without the signal's round trip
        return CreateTaskResult(
            task_id=record.id,
            status="working",
            created_at=iso(record.created),
            last_updated_at=iso(record.updated),
            ttl_ms=record.ttl_ms,
            poll_interval_ms=record.poll_ms,
        )

    # -- tasks/* -----------------------------------------------------------------------

    async def _handle_get(self, ctx: ServerRequestContext[Any, Any], params: GetTaskParams) -> GetTaskResult:
        _check_request(ctx, params.task_id)
        return await self._get(params.task_id)

    async def _handle_update(self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams) -> UpdateTaskResult:
        _check_request(ctx, params.task_id)
        return await self._update(params.task_id, params.input_responses)

    async def _handle_cancel(self, ctx: ServerRequestContext[Any, Any], params: GetTaskParams) -> CancelTaskResult:
        _check_request(ctx, params.task_id)
        return await self._cancel(params.task_id)

    # The methods past their gates, for the caller's principal (``fastmcp_tasks.handlers``' three functions).

    async def _get(self, task_id: str) -> GetTaskResult:
        scope = _scope()
        with self.engine.changes.watching(ref(task_id)) as watch:  # before the read: no change is missed
            record = await _stored(self.engine.read(task_id, scope))
            hold = (
                0.0 if record is None or record.state is not TaskState.WORKING else min(self.hold, record.poll_ms / 1e3)
            )
            if hold > 0 and await wait_event(watch.event, hold):
                # the record read above was this id's, in this scope: so is the final one this process wrote
                record = watch.final or await _stored(self.engine.read(task_id, scope))
        if record is None:
            raise _not_found(task_id)
        return _detailed(record)

    async def _update(self, task_id: str, responses: dict[str, Any]) -> UpdateTaskResult:
        from kvstores.tasks._runner import checked_answer

        if not await _stored(self.engine.answer(task_id, _scope(), responses, checked_answer)):
            raise _not_found(task_id)
        return UpdateTaskResult()

    async def _cancel(self, task_id: str) -> CancelTaskResult:
        if not await _stored(self.engine.cancel(task_id, _scope())):
            raise _not_found(task_id)
        return CancelTaskResult()


class _FastMCPTasksSettings(BaseSettings):
    """What ``fastmcp-tasks``' ``TasksSettings`` reads: the variables and ``.env`` file of a migrating server."""

    model_config = SettingsConfigDict(
        env_prefix="FASTMCP_TASKS_", env_file=os.getenv("FASTMCP_ENV_FILE", ".env"), extra="ignore"
    )

    encryption_key: SecretStr | None = None


def _refuse_fastmcp_tasks_key() -> None:
    """ValueError when ``FASTMCP_TASKS_ENCRYPTION_KEY`` is set (see :class:`StoreTasks`)."""
    if _FastMCPTasksSettings().encryption_key is None:
        return
    raise ValueError(
        "FASTMCP_TASKS_ENCRYPTION_KEY is set, but StoreTasks does not read it: kvstores.tasks seals each task "
        "record (arguments, results, the caller's token and headers) with the store's encryption_keys, "
        "open_store(url, encryption_keys=[...]). Give the store its keys and unset FASTMCP_TASKS_ENCRYPTION_KEY, "
        "so that no server runs believing its tasks are encrypted when they are not."
    )


def _validate(tool: Any, arguments: dict[str, Any], strict: bool) -> None:
    """Validate a function tool's call as its synchronous path would, before any task exists (as
    ``fastmcp-tasks``' ``coerce_task_arguments``): ``fastmcp.exceptions.ValidationError`` when invalid."""
    import logging

    from fastmcp.exceptions import ValidationError
    from fastmcp.server.dependencies import without_injected_parameters
    from fastmcp.tools.function_tool import FunctionTool, _validate_input
    from fastmcp.utilities.types import get_cached_typeadapter
    from pydantic import ValidationError as PydanticValidationError

    if not isinstance(tool, FunctionTool):
        return
    fn = without_injected_parameters(tool.fn, run_in_thread=tool.run_in_thread)
    try:
        _validate_input(get_cached_typeadapter(_call_shape(fn)), arguments, strict=True if strict else None)
    except PydanticValidationError as exc:
        raise ValidationError(str(exc), log_level=logging.WARNING) from exc


def _call_shape(fn: Any) -> Any:
    """A function with ``fn``'s parameters that returns them: validating a call to it never runs the tool."""
    from fastmcp.tools.function_tool import _resolve_param_hints

    def probe(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return dict(inspect.signature(probe).bind(*args, **kwargs).arguments)

    hints = _resolve_param_hints(fn)
    signature = inspect.signature(fn)
    probe.__signature__ = signature  # type: ignore[attr-defined]
    probe.__annotations__ = {
        name: hints.get(name, parameter.annotation)
        for name, parameter in signature.parameters.items()
        if name in hints or parameter.annotation is not inspect.Parameter.empty
    }
    return probe


async def _never(*_: Any) -> Any:
    raise AssertionError("never run")


async def _stored(call: Any) -> Any:
    """``await call``, a store failure answered as an internal error (retryable), never as "not found"."""
    try:
        return await call
    except KVStoreError as exc:
        raise MCPError(code=INTERNAL_ERROR, message=f"the task store failed: {type(exc).__name__}") from exc


def _not_found(task_id: str) -> MCPError:
    """The one answer for a missing, expired or another principal's task (as ``fastmcp-tasks``)."""
    return MCPError(code=INVALID_PARAMS, message=f"Task {task_id} not found")


def _scope() -> str | None:
    """The principal that owns the tasks of this request: ``client_id|sub`` of its token (as ``fastmcp-tasks``)."""
    from fastmcp.server.dependencies import get_access_token

    token = get_access_token()
    if token is None:
        return None
    sub = token.claims.get("sub") if token.claims else None
    return f"{token.client_id}|{sub}" if sub else token.client_id


def _caller(context: Context) -> dict[str, Any]:
    """The caller's identity to restore in the worker: token, headers, session id, request id."""
    from fastmcp.server.dependencies import get_access_token, get_http_headers

    token = get_access_token()
    try:
        session_id: str | None = context.session_id
    except RuntimeError:
        session_id = None
    request = context.request_context
    return {
        "access_token": None if token is None else token.model_dump_json(),
        "headers": get_http_headers(include_all=True) or None,
        "session_id": session_id,
        "origin_request_id": None if request is None else str(request.request_id),
    }


def _check_request(ctx: ServerRequestContext[Any, Any], task_id: str) -> None:
    """The gates of every ``tasks/*`` method (as ``fastmcp-tasks``): the client declared the
    extension for this request (-32021), and an ``Mcp-Name`` header matches the ``taskId``."""
    from fastmcp.server.dependencies import get_http_request
    from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
    from mcp_types.jsonrpc import HEADER_MISMATCH

    if read_client_extension_settings(ctx, TASKS_EXTENSION_ID) is None:
        raise MCPError(
            code=MISSING_REQUIRED_CLIENT_CAPABILITY,
            message=f"This request targets the tasks extension ({TASKS_EXTENSION_ID}); "
            "the client did not declare it for this request.",
            data=missing_capability_error_data(),
        )
    try:
        header = get_http_request().headers.get(MCP_NAME_HEADER)
    except RuntimeError:
        return
    if header is not None and decode_header_value(header) != task_id:
        raise MCPError(
            code=HEADER_MISMATCH,
            message=f"{MCP_NAME_HEADER} header does not match the request body's 'taskId' parameter",
        )


def _detailed(record: TaskRecord) -> GetTaskResult:
    """``tasks/get``'s answer for a record."""
    payload: dict[str, Any] = {}
    if record.state is TaskState.COMPLETED:
        payload["result"] = record.result
    elif record.state is TaskState.FAILED:
        payload["error"] = record.error
    elif record.state is TaskState.INPUT_REQUIRED:
        payload["input_requests"] = record.input_requests
    return GetTaskResult(
        task_id=record.id,
        status=record.state.value,
        created_at=iso(record.created),
        last_updated_at=iso(record.updated),
        ttl_ms=record.ttl_ms,
        poll_interval_ms=record.poll_ms,
        status_message=record.message,
        **payload,
    )


async def serve_worker(mcp: Any, *, concurrency: int | None = None) -> None:
    """Run a worker for the tasks of ``mcp`` (a FastMCP server with :class:`StoreTasks`) until cancelled.

    What ``kvstores worker module:app`` runs: extra workers that serve no HTTP.
    """
    extension = mcp._extensions.get(TASKS_EXTENSION_ID)
    if not isinstance(extension, StoreTasks):
        raise TypeError(f"{mcp!r} has no StoreTasks extension (mcp.add_extension(StoreTasks(store)))")
    worker = extension.worker()
    if concurrency is not None:
        worker = Worker(worker.engine, worker.execute, concurrency=concurrency, rescan=worker.rescan)
    try:
        await worker.run()
    finally:
        # The worker's wake-ups came through the store's signal channel: stop its readers before the loop
        # ends (a SQLite poll still in aiosqlite's thread then printed a traceback at Ctrl-C).
        await signals_channel(worker.engine.store).aclose()
