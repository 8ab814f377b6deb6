"""``TaskClient``: the client side of the tasks extension on the wire, for when FastMCP's own is not there.

FastMCP's ``Client`` drives background tasks only with ``fastmcp-tasks`` imported, and the newest
``fastmcp-tasks`` pins FastMCP 4.1. This speaks the extension's JSON-RPC (protocol 2026-07-28, no
session) itself, as that client does: ``tools/call`` with the extension declared in the request's
``_meta``, then ``tasks/get``, ``tasks/update`` and ``tasks/cancel``, and it polls with the same
backoff (at once, then ``poll_seconds``, each pause twice the last, up to the ``pollIntervalMs``
the server advertises). ``kvstores demo``, ``kvstores bench --tasks`` and the tests use it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from types import TracebackType
from typing import Any

import httpx2
from fastmcp.utilities.tasks import TASKS_EXTENSION_ID
from mcp.shared.exceptions import MCPError
from mcp_types.version import LATEST_MODERN_VERSION

from kvstores.tasks._record import TaskState

__all__ = ["KEEP_ALIVE", "TERMINAL_STATES", "TaskClient"]

TERMINAL_STATES = tuple(state.value for state in TaskState if state.terminal)
"""The states a task never leaves."""

KEEP_ALIVE = 4.0
"""Seconds an idle connection is kept: under uvicorn's default keep-alive (5 s), so that the client drops it first
(a server closing it while a request goes out fails that request)."""


class TaskClient:
    """A client of the tasks extension of the MCP server at ``url`` (its Streamable HTTP endpoint)."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        headers: dict[str, str] | None = None,
        poll_seconds: float = 0.02,
        connections: int = 100,
        keep_alive: float = KEEP_ALIVE,
        timeout: float = 30.0,
    ) -> None:
        self.url = url
        self.poll_seconds = poll_seconds
        self.headers = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "mcp-protocol-version": LATEST_MODERN_VERSION,
            **(headers or {}),
        }
        if token is not None:
            self.headers["authorization"] = f"Bearer {token}"
        self._ids = itertools.count(1)
        limits = httpx2.Limits(
            max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=keep_alive
        )
        self.http = httpx2.AsyncClient(timeout=timeout, limits=limits)

    async def __aenter__(self) -> TaskClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self.http.aclose()

    async def respond(self, method: str, params: dict[str, Any], *, declare: bool = True) -> dict[str, Any]:
        """Send one request (the extension declared unless ``declare`` is False); its whole JSON-RPC response."""
        meta: dict[str, Any] = {
            "io.modelcontextprotocol/protocolVersion": LATEST_MODERN_VERSION,
            "io.modelcontextprotocol/clientInfo": {"name": "kvstores-task-client", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXTENSION_ID: {}}} if declare else {},
        }
        body = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": {**params, "_meta": meta}}
        headers = {**self.headers, "mcp-method": method}
        name = params.get("name", params.get("taskId"))
        if isinstance(name, str):
            headers["mcp-name"] = name
        response = await self.http.post(self.url, json=body, headers=headers)
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            lines = (line[5:].strip() for line in response.text.splitlines() if line.startswith("data:"))
            answers = [json.loads(line) for line in lines if line]
            answer = next((a for a in reversed(answers) if a.get("id") == body["id"]), None)
        else:
            answer = response.json()  # a JSON-RPC error may come with a 4xx status
        if not isinstance(answer, dict) or ("result" not in answer and "error" not in answer):
            raise MCPError(-32603, f"{method}: HTTP {response.status_code} without an answer: {response.text[:300]}")
        return answer

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """One request; its ``result`` (a JSON-RPC error raises :class:`MCPError`)."""
        answer = await self.respond(method, params)
        if "error" in answer:
            error = answer["error"]
            raise MCPError(error.get("code", -32603), str(error.get("message", error)), error.get("data"))
        result: dict[str, Any] = answer["result"]
        return result

    async def submit(self, tool: str, arguments: dict[str, Any]) -> str:
        """``tools/call`` that must create a task: the task's id."""
        created = await self.request("tools/call", {"name": tool, "arguments": arguments})
        if created.get("resultType") != "task":
            raise MCPError(-32603, f"tools/call of {tool!r} did not create a task: {str(created)[:300]}")
        return str(created["taskId"])

    async def get(self, task_id: str) -> dict[str, Any]:
        """``tasks/get``: the task (status, and its result, error or input requests)."""
        return await self.request("tasks/get", {"taskId": task_id})

    async def cancel(self, task_id: str) -> dict[str, Any]:
        """``tasks/cancel``."""
        return await self.request("tasks/cancel", {"taskId": task_id})

    async def update(self, task_id: str, responses: dict[str, Any]) -> dict[str, Any]:
        """``tasks/update``: answer the task's input requests."""
        return await self.request("tasks/update", {"taskId": task_id, "inputResponses": responses})

    async def wait(
        self, task_id: str, *, until: tuple[str, ...] = TERMINAL_STATES, within: float = 60.0
    ) -> dict[str, Any]:
        """Poll ``tasks/get`` until the task's status is one of ``until``: the task (TimeoutError after ``within``)."""
        pause = self.poll_seconds
        async with asyncio.timeout(within):
            while True:
                task = await self.get(task_id)
                if task.get("status") in until:
                    return task
                ceiling = max(float(task.get("pollIntervalMs") or 500) / 1e3, self.poll_seconds)
                await asyncio.sleep(min(pause, ceiling))
                pause = min(pause * 2, ceiling)

    async def result(self, task_id: str, *, within: float = 60.0) -> dict[str, Any]:
        """Wait for the task to end: its ``CallToolResult`` (a failed or cancelled task raises :class:`MCPError`)."""
        task = await self.wait(task_id, within=within)
        if task["status"] != "completed":
            detail = task.get("error") or task.get("statusMessage") or task["status"]
            raise MCPError(-32603, f"task {task['status']}: {str(detail)[:300]}")
        outcome: dict[str, Any] = task["result"]
        return outcome
