"""``StoreTasks`` as a drop-in for ``fastmcp_tasks.TasksExtension`` 4.1.4 (issue 39 item 10), over real HTTP.

Each test is a behaviour where FastMCP's own tests (``tests/tasks`` of FastMCP 4.1.4's sdist, run
against ``StoreTasks`` in ``.ci/compat-matrix``'s ``fastmcp-4.1-tasks`` row) pass with
``TasksExtension`` and failed with ``StoreTasks``: arguments validated at ``tools/call``, the
default TTL, a dependency that cannot be resolved, mounted servers' middleware,
``FASTMCP_TASKS_ENCRYPTION_KEY``, a state-only guard round and a server's shutdown. The behaviour
is the extension's, the same on every store: these run on the memory store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import mcp_types as mt
import pytest
from fastmcp import Context, FastMCP
from fastmcp.dependencies import Depends
from fastmcp.server.dependencies import CurrentFastMCP
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools.base import ToolResult

from kvstores import open_store
from kvstores.tasks import DEFAULT_TTL, StoreTasks
from tests.support.tasks import TaskWire, ThreadServer

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def wire_of(mcp: FastMCP) -> AsyncIterator[TaskWire]:
    """``mcp`` on a uvicorn thread, and a client of it (both closed after the block)."""
    with ThreadServer(mcp.http_app()) as server:
        wire = TaskWire(server.url)
        try:
            yield wire
        finally:
            await wire.aclose()


def tasks_server(name: str, store: Any, **settings: Any) -> FastMCP:
    mcp = FastMCP(name, **settings)
    mcp.add_extension(StoreTasks(store))

    @mcp.tool(task=True)
    async def square(n: int) -> int:
        return n * n

    return mcp


async def stored_tasks(mcp: FastMCP) -> list[str]:
    extension = cast(StoreTasks, mcp._extensions["io.modelcontextprotocol/tasks"])
    return await extension.engine.all_refs()


def refusal(answer: dict[str, Any]) -> str:
    """The text of a refused ``tools/call``: a JSON-RPC error or an ``isError`` result, never a task."""
    if "error" in answer:
        return str(answer["error"]["message"])
    result = answer["result"]
    assert result.get("resultType") != "task" and result.get("isError") is True, answer
    return str(result["content"][0]["text"])


async def test_invalid_arguments_are_refused_at_tools_call_and_create_no_task() -> None:
    mcp = tasks_server("lax", open_store("memory://"))
    async with wire_of(mcp) as wire:
        assert "validation error" in refusal(await wire.call("square", {"n": "not-a-number"})).lower()
        assert "validation error" in refusal(await wire.call("square", {})).lower()
        assert "validation error" in refusal(await wire.call("square", {"n": 2, "m": 3})).lower()
        assert await stored_tasks(mcp) == []
        lax = await wire.wait(await wire.submit("square", {"n": "6"}))  # a lax coercion, as the sync path
        assert lax["result"]["structuredContent"] == {"result": 36}


async def test_strict_input_validation_is_honoured_at_submission() -> None:
    mcp = tasks_server("strict", open_store("memory://"), strict_input_validation=True)
    async with wire_of(mcp) as wire:
        assert "validation error" in refusal(await wire.call("square", {"n": "1"})).lower()
        assert await stored_tasks(mcp) == []
        done = await wire.wait(await wire.submit("square", {"n": 7}))
        assert done["result"]["structuredContent"] == {"result": 49}


async def test_the_default_ttl_is_docket_s_900_seconds() -> None:
    assert DEFAULT_TTL == 900.0
    mcp = tasks_server("ttl", open_store("memory://"))
    async with wire_of(mcp) as wire:
        created = (await wire.call("square", {"n": 3}))["result"]
        assert created["ttlMs"] == 900_000
        assert (await wire.wait(created["taskId"]))["ttlMs"] == 900_000


async def test_an_unresolvable_dependency_fails_the_task_and_a_raising_body_completes_it() -> None:
    mcp = FastMCP("dependencies")
    mcp.add_extension(StoreTasks(open_store("memory://")))

    async def failing_dependency() -> str:
        raise ValueError("Dependency failed!")

    @mcp.tool(task=True)
    async def with_failing_dependency(value: str, dep: str = cast(Any, Depends(failing_dependency))) -> str:
        return f"Got: {dep}"

    @mcp.tool(task=True)
    async def raising(value: str) -> str:
        raise ValueError(f"raised {value}")

    async with wire_of(mcp) as wire:
        failed = await wire.wait(await wire.submit("with_failing_dependency", {"value": "x"}))
        assert failed["status"] == "failed", failed
        assert failed["error"]["code"] == -32603 and "dep" in failed["error"]["message"]
        assert "result" not in failed
        completed = await wire.wait(await wire.submit("raising", {"value": "y"}))
        assert completed["status"] == "completed" and completed["result"]["isError"] is True
        assert "raised y" in completed["result"]["content"][0]["text"]


class Tracing(Middleware):
    """Records each ``tools/call`` it wraps."""

    def __init__(self, name: str, calls: list[str]) -> None:
        super().__init__()
        self.name = name
        self.calls = calls

    async def on_call_tool(
        self, context: MiddlewareContext[mt.CallToolRequestParams], call_next: CallNext[mt.CallToolRequestParams, Any]
    ) -> ToolResult:
        self.calls.append(f"{self.name}:before")
        result = await call_next(context)
        self.calls.append(f"{self.name}:after")
        return cast(ToolResult, result)


async def test_a_mounted_task_runs_without_the_mounted_servers_middleware_on_its_own_server() -> None:
    calls: list[str] = []
    grandchild = FastMCP("grandchild")

    @grandchild.tool(task=True)
    async def compute(x: int, server: FastMCP = CurrentFastMCP()) -> str:  # noqa: B008 - as users write it
        calls.append("grandchild:tool")
        return f"{x * 2} on {server.name}"

    @grandchild.tool(task=True)
    async def where(ctx: Context) -> str:
        return ctx.fastmcp.name

    grandchild.add_middleware(Tracing("grandchild", calls))
    child = FastMCP("child")
    child.mount(grandchild, namespace="gc")
    child.add_middleware(Tracing("child", calls))
    parent = FastMCP("parent")
    parent.add_extension(StoreTasks(open_store("memory://")))
    parent.mount(child, namespace="c")
    parent.add_middleware(Tracing("parent", calls))
    async with wire_of(parent) as wire:
        done = await wire.wait(await wire.submit("c_gc_compute", {"x": 5}))
        assert done["result"]["structuredContent"] == {"result": "10 on child"}
        assert calls == ["parent:before", "parent:after", "grandchild:tool"]
        where = await wire.wait(await wire.submit("c_gc_where", {}))
        assert where["result"]["structuredContent"] == {"result": "child"}


def test_fastmcp_tasks_encryption_key_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    store = open_store("memory://")
    monkeypatch.chdir(tmp_path)  # no .env of the checkout's
    StoreTasks(store)
    monkeypatch.setenv("FASTMCP_TASKS_ENCRYPTION_KEY", "a-key-that-would-be-ignored")
    with pytest.raises(ValueError, match=r"FASTMCP_TASKS_ENCRYPTION_KEY.*encryption_keys"):
        StoreTasks(store)
    monkeypatch.delenv("FASTMCP_TASKS_ENCRYPTION_KEY")
    (tmp_path / ".env").write_text("FASTMCP_TASKS_ENCRYPTION_KEY=from-the-dotenv-file\n")
    with pytest.raises(ValueError, match="encryption_keys"):
        StoreTasks(store)


async def test_a_state_only_guard_round_completes_with_an_error_that_says_so() -> None:
    mcp = FastMCP("guard")
    mcp.add_extension(StoreTasks(open_store("memory://")))

    @mcp.tool(task=True)
    async def checkpoint(ctx: Context) -> str | mt.InputRequiredResult:
        if ctx.request_state is None:
            return mt.InputRequiredResult(result_type="input_required", input_requests={}, request_state="carried")
        return "done"

    async with wire_of(mcp) as wire:
        final = await wire.wait(await wire.submit("checkpoint", {}))
        assert final["status"] == "completed" and final["result"]["isError"] is True
        assert "state-only" in final["result"]["content"][0]["text"]
