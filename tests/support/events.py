"""Helpers for the event-store tests: a store that fails on demand, MCP servers on a free port, raw SSE."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn
from fastmcp import Client, Context, FastMCP
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.routing import Route

from kvstores._loopback import tcp_socket
from kvstores.errors import StoreConnectionError

PROTOCOL_VERSION = "2025-11-25"
"""The first protocol version whose clients resume (the transport primes streams for them)."""

RECONNECT_MS = 200
"""retry_interval the servers advertise: how long clients wait before resuming."""

DROP_AFTER = 3
"""The long task closes its response stream after this many steps..."""

STEPS = 6
"""...of this many; the steps after the drop come partly before, partly after the client is back."""

LIVE_AFTER = 0.5
"""Seconds the task waits after the first post-drop step, so that the client has resumed by then."""


class FlakyStore:
    """Wraps a store: counts calls, fails with StoreConnectionError while ``down``, blocks while ``hang``."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.down = False
        self.hang = False
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if self.hang:
                await asyncio.Event().wait()
            if self.down:
                raise StoreConnectionError("backend stopped by the test")
            return await method(*args, **kwargs)

        return call


class SpyEventStore(EventStore):
    """Delegates to an event store and records each replay: (last event id, stream id returned, events sent)."""

    def __init__(self, inner: EventStore) -> None:
        self.inner = inner
        self.replays: list[tuple[str, str | None, int]] = []

    async def store_event(self, stream_id: str, message: Any) -> str:
        return await self.inner.store_event(stream_id, message)

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> str | None:
        sent = 0

        async def counting(event: EventMessage) -> None:
            nonlocal sent
            sent += 1
            await send_callback(event)

        stream_id = await self.inner.replay_events_after(last_event_id, counting)
        self.replays.append((last_event_id, stream_id, sent))
        return stream_id


def expected_notes() -> list[tuple[str, str]]:
    """What a client of the long task receives, in order: (kind, text) per notification."""
    return [note for step in range(1, STEPS + 1) for note in (("progress", f"step {step}"), ("log", f"log {step}"))]


def fastmcp_server() -> FastMCP:
    """A FastMCP server with ``long_task`` (progress, logs and a dropped stream) and ``echo``."""
    mcp = FastMCP("events")

    @mcp.tool
    async def long_task(ctx: Context) -> str:
        for step in range(1, STEPS + 1):
            await ctx.report_progress(step, STEPS, f"step {step}")
            await ctx.info(f"log {step}")
            if step == DROP_AFTER:
                await ctx.close_sse_stream()
            if step == DROP_AFTER + 1:
                await asyncio.sleep(LIVE_AFTER)
        return "done"

    @mcp.tool
    async def echo(text: str) -> str:
        return text

    return mcp


def sdk_app(event_store: EventStore) -> Starlette:
    """The same two tools on the plain MCP SDK: a lowlevel Server behind StreamableHTTPSessionManager."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        schema = {"type": "object", "properties": {"text": {"type": "string"}}}
        return types.ListToolsResult(
            tools=[types.Tool(name=name, input_schema=schema) for name in ("long_task", "echo")]
        )

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name == "echo":
            text = str((params.arguments or {})["text"])
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)])
        for step in range(1, STEPS + 1):
            await ctx.session.report_progress(step, STEPS, f"step {step}")
            await ctx.session.send_log_message("info", {"msg": f"log {step}"}, related_request_id=ctx.request_id)
            if step == DROP_AFTER:
                await ctx.close_sse_stream()
            if step == DROP_AFTER + 1:
                await asyncio.sleep(LIVE_AFTER)
        return types.CallToolResult(content=[types.TextContent(type="text", text="done")])

    return sdk_starlette(Server("plain", on_list_tools=list_tools, on_call_tool=call_tool), event_store)


def sdk_starlette(server: Server[Any], event_store: EventStore) -> Starlette:
    """``server`` (the SDK's lowlevel Server) behind a StreamableHTTPSessionManager on ``event_store``, at /mcp."""
    manager = StreamableHTTPSessionManager(server, event_store=event_store, retry_interval=RECONNECT_MS)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    return Starlette(routes=[Route("/mcp", endpoint=manager.asgi_app)], lifespan=lifespan)


@contextlib.asynccontextmanager
async def serving(app: Any, port: int = 0) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 in this event loop; yield the MCP endpoint URL.

    ``port`` 0 takes a free one; a given port may be served again after a restart.
    """
    with tcp_socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
            yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
        finally:
            server.should_exit = True
            await task


async def sse_events(response: httpx.Response) -> AsyncIterator[dict[str, str]]:
    """The events of an SSE response as dicts of their fields (``data`` lines joined)."""
    event: dict[str, str] = {}
    async for line in response.aiter_lines():
        if not line:
            if event:
                yield event
            event = {}
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data" and "data" in event:
            value = event["data"] + "\n" + value
        if name:
            event[name] = value


class RawSession:
    """An MCP session spoken by hand over httpx, to see exactly what crosses the wire."""

    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self.http = http
        self.url = url
        self.session_id = ""

    def headers(self, **extra: str) -> dict[str, str]:
        """Headers of a request in this session."""
        headers = {"accept": "application/json, text/event-stream", "mcp-protocol-version": PROTOCOL_VERSION}
        if self.session_id:
            headers["mcp-session-id"] = self.session_id
        return {**headers, **extra}

    async def open(self) -> RawSession:
        """Initialize the session."""
        client = {"name": "raw", "version": "0"}
        params = {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": client}
        body = self.request(0, "initialize", params)
        async with self.http.stream("POST", self.url, json=body, headers=self.headers()) as r:
            r.raise_for_status()
            self.session_id = r.headers["mcp-session-id"]
            assert any(["result" in event.get("data", "") async for event in sse_events(r)])
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        (await self.http.post(self.url, json=note, headers=self.headers())).raise_for_status()
        return self

    @staticmethod
    def request(request_id: int | str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """A JSON-RPC request."""
        return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}

    def call(self, request_id: int | str, tool: str, arguments: dict[str, Any]) -> Any:
        """Stream a tools/call that asks for progress: ``async with session.call(...) as response``."""
        params = {"name": tool, "arguments": arguments, "_meta": {"progressToken": f"p{request_id}"}}
        body = self.request(request_id, "tools/call", params)
        return self.http.stream("POST", self.url, json=body, headers=self.headers())

    def resume(self, last_event_id: str) -> Any:
        """Stream a GET that resumes after ``last_event_id``."""
        return self.http.stream("GET", self.url, headers=self.headers(**{"last-event-id": last_event_id}))


def note_of(data: str) -> tuple[str, str] | None:
    """(kind, text) of a progress or log notification's JSON, None for anything else."""
    message = json.loads(data)
    if message.get("method") == "notifications/progress":
        return ("progress", message["params"]["message"])
    if message.get("method") == "notifications/message":
        return ("log", message["params"]["data"]["msg"])
    return None


async def run_long_task(url: str) -> tuple[list[tuple[str, str]], str, str]:
    """Call long_task with the FastMCP client (legacy mode), then echo: (notifications, result, echo)."""
    notes: list[tuple[str, str]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append(("progress", str(message)))

    async def on_log(message: Any) -> None:
        notes.append(("log", message.data["msg"]))

    async with Client(url, mode="legacy", progress_handler=on_progress, log_handler=on_log) as client:
        result = await client.call_tool("long_task", {})
        echo = await client.call_tool("echo", {"text": "still here"})
    return notes, result.content[0].text, echo.content[0].text
