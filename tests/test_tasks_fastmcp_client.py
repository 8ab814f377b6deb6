"""FastMCP's own client (``fastmcp-tasks``' client half) drives ``StoreTasks``: issue 29 item 1.

FastMCP's client supports tasks only with ``fastmcp_tasks`` imported, and the newest
``fastmcp-tasks`` (4.1.4) pins FastMCP 4.1.4, so this module runs in ``.ci/compat-matrix``'s
``fastmcp-4.1-tasks`` row (FastMCP 4.1.4 + fastmcp-tasks 4.1.4), not in the main suite (FastMCP
4.2, where tests/test_tasks.py drives the same scenarios through a wire-level client; see
tests/conftest.py). The server is kvstores' ``StoreTasks`` on each backend row of the matrix;
the client is FastMCP's ``Client`` connected in process, exactly as a user's test would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import fastmcp_tasks  # tests/conftest.py leaves this module out where it is not installed
import pytest
from fastmcp import Client, FastMCP
from fastmcp.dependencies import Progress
from fastmcp.exceptions import ToolError
from fastmcp.utilities.tasks import TaskConfig

from tests.support.tasks import build_server

pytestmark = pytest.mark.anyio


def _server(store: Any) -> FastMCP:
    """The main suite's task server (tests/support/tasks.py), with a progress tool that asks for 50 ms polls."""
    mcp = build_server(store)

    @mcp.tool(task=TaskConfig(poll_interval=timedelta(milliseconds=50)))
    async def steps(count: int, progress: Progress = Progress()) -> str:  # noqa: B008 - as users write it
        await progress.set_total(count)
        for step in range(count):
            await asyncio.sleep(0.1)
            await progress.increment()
            await progress.set_message(f"step {step + 1}/{count}")
        return f"{count} steps"

    return mcp


@pytest.fixture
async def client(store: Any) -> AsyncIterator[Client[Any]]:
    async def answer(message: str, response_type: Any, params: Any, context: Any) -> dict[str, Any]:
        assert message == "your name?"
        return {"name": "Ada"}

    async with Client(_server(store), elicitation_handler=answer) as connected:
        yield connected


async def test_call_tool_is_transparent(client: Client[Any]) -> None:
    result = await client.call_tool("echo", {"text": "hi"})
    assert result.data == "echo hi"
    with pytest.raises(ToolError, match="boom now"):
        await client.call_tool("boom", {"text": "now"})


async def test_a_task_handle_reports_status_waits_and_gives_the_result(client: Client[Any]) -> None:
    task = await fastmcp_tasks.call_tool_task(client, "steps", {"count": 4})
    assert len(task.task_id) >= 22  # at least 128 random bits, URL-safe
    assert task.create_result.status == "working"
    assert task.create_result.poll_interval_ms == 50
    seen: set[str | None] = set()
    deadline = time.monotonic() + 10
    while (status := await task.status()).status == "working" and time.monotonic() < deadline:
        seen.add(status.status_message)
        await asyncio.sleep(0.05)
    assert any(message and "/4" in message for message in seen), f"no progress while polling: {seen}"
    assert (await task.wait(timeout=10)).status == "completed"
    assert (await task.result()).data == "4 steps"


async def test_a_failed_task_raises_or_answers_an_error(client: Client[Any]) -> None:
    task = await fastmcp_tasks.call_tool_task(client, "boom", {"text": "x"}, raise_on_error=False)
    result = await task.result()
    assert result.is_error and "boom x" in result.content[0].text
    raising = await fastmcp_tasks.call_tool_task(client, "boom", {"text": "y"})
    with pytest.raises(ToolError, match="boom y"):
        await raising.result()


async def test_cancel_ends_a_running_task_cancelled(client: Client[Any]) -> None:
    task = await fastmcp_tasks.call_tool_task(client, "sleeper", {"seconds": 30}, raise_on_error=False)
    await asyncio.sleep(0.3)
    started = time.monotonic()
    await task.cancel()
    assert (await task.wait(timeout=5)).status == "cancelled"
    assert time.monotonic() - started < 2
    assert (await task.result()).is_error


async def test_modes(client: Client[Any]) -> None:
    assert (await client.call_tool("required_echo", {"text": "a"})).data == "required a"
    assert (await client.call_tool("plain_echo", {"text": "b"})).data == "plain b"
    with pytest.raises(ToolError, match="did not run as a task"):
        await fastmcp_tasks.call_tool_task(client, "plain_echo", {"text": "c"})


async def test_input_is_asked_through_the_elicitation_handler(client: Client[Any]) -> None:
    assert (await client.call_tool("ask", {})).data == "hello Ada"
    task = await fastmcp_tasks.call_tool_task(client, "ask", {})
    parked = await task.wait(state="input_required", timeout=10)
    # the surfaced key is minted fresh per ask (as fastmcp-tasks does); the request is the tool's
    assert [request["params"]["message"] for request in (parked.input_requests or {}).values()] == ["your name?"]
    assert (await task.result()).data == "hello Ada"
