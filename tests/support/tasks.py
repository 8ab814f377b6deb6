"""Background-task tests (tests/test_tasks.py): a FastMCP server with kvstores.tasks, in this process or as
a child process, and a wire-level client of the tasks extension over real HTTP.

FastMCP 4.2.3's own client drives tasks only with ``fastmcp-tasks`` imported, which cannot be installed
beside it (it pins FastMCP 4.1.4), so :class:`TaskWire` speaks the 2026-07-28 JSON-RPC through
:class:`kvstores.tasks.TaskClient`, as that client would: ``tools/call`` with the extension declared in
``_meta``, then ``tasks/get|update|cancel`` (tests/test_tasks_fastmcp_client.py drives FastMCP 4.1's own).

Run as a script, this module is the server: ``python -m tests.support.tasks --port P --store URL
[--options JSON] [--lease S] [--ttl S] [--keys K1,K2] [--no-http]`` (``--no-http``: a worker only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
from fastmcp import Context, FastMCP
from fastmcp.server.auth.providers.jwt import StaticTokenVerifier
from fastmcp.server.dependencies import Progress, get_access_token, get_http_headers
from fastmcp.utilities.tasks import TaskConfig
from mcp.shared.exceptions import MCPError
from mcp_types import InputRequiredResult
from starlette.requests import Request
from starlette.responses import PlainTextResponse

from kvstores.tasks import TaskClient
from tests.support import Backend, free_port, stop_process
from tests.support.sessions import TOKENS

ROOT = Path(__file__).resolve().parents[2]

RUNS = "test_task_runs"
"""The collection where ``counted`` records each run of a task (its side effect, for the re-run tests)."""


def build_server(store: Any, *, auth: bool = False, **options: Any) -> FastMCP:
    """A FastMCP server with kvstores.tasks on ``store`` and the tools the tests call."""
    from kvstores.tasks import StoreTasks

    mcp = FastMCP("tasks", session_state_store=store, auth=StaticTokenVerifier(tokens=TOKENS) if auth else None)
    mcp.add_extension(StoreTasks(store, run_once={"once"}, **options))

    @mcp.tool(task=True)
    async def echo(text: str) -> str:
        return f"echo {text}"

    @mcp.tool(task=True)
    async def boom(text: str) -> str:
        raise ValueError(f"boom {text}")

    @mcp.tool(task=True)
    async def sleeper(seconds: float, marker: str = "") -> str:
        """Sleeps; records in the store that it started, and that it was cancelled if it was."""
        await store.put(marker or "sleeper", {"started": time.time(), "runs": 1}, collection=RUNS)
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            await asyncio.shield(store.put((marker or "sleeper") + "/cancelled", {"at": time.time()}, collection=RUNS))
            raise
        return "slept"

    @mcp.tool(task=True)
    async def counted(seconds: float, marker: str) -> str:
        """Adds one to the runs of ``marker``, sleeps (``seconds`` on its first run, 0.5 s on a re-run), and
        answers which process ran it."""
        runs = await store.update(marker, _add_run, collection=RUNS)
        await asyncio.sleep(seconds if runs is not None and runs["runs"] == 1 else 0.5)
        import os

        return f"pid {os.getpid()}"

    @mcp.tool(task=True)
    async def once(seconds: float, marker: str) -> str:
        """``counted`` that must never run twice (StoreTasks(run_once={"once"}))."""
        return await counted(seconds, marker)

    @mcp.tool(task=True)
    async def stepper(steps: int, pause: float, progress: Progress = Progress()) -> str:  # noqa: B008 - as users write it
        """Reports progress (the Progress dependency) step by step."""
        await progress.set_total(steps)
        for step in range(1, steps + 1):
            await progress.increment()
            await progress.set_message(f"step {step} of {steps}")
            await asyncio.sleep(pause)
        return "stepped"

    @mcp.tool(task=True)
    async def reporter(steps: int, pause: float, ctx: Context) -> str:
        """Reports progress through ctx.report_progress."""
        for step in range(1, steps + 1):
            await ctx.report_progress(step, steps, f"report {step}")
            await asyncio.sleep(pause)
        return "reported"

    running = [0, 0]  # tools of ``overlap`` running now, and the most that ever ran at once

    @mcp.tool(task=True)
    async def overlap(seconds: float) -> int:
        """Sleeps; answers the most ``overlap`` runs this server ever had at once (its worker's concurrency)."""
        running[0] += 1
        running[1] = max(running)
        try:
            await asyncio.sleep(seconds)
        finally:
            running[0] -= 1
        return running[1]

    @mcp.tool(task=True)
    async def background(ctx: Context) -> dict[str, bool]:
        """What the tool's context says of its run: a background task, with no request of its own."""
        return {"is_background": ctx.is_background_task, "no_request_context": ctx.request_context is None}

    @mcp.tool(task=True)
    async def fault() -> str:
        raise MCPError(code=-32001, message="a protocol fault")

    @mcp.tool(task=True)
    async def huge(megabytes: int) -> str:
        return "x" * (megabytes * 1_000_000)

    @mcp.tool
    async def run_log(marker: str) -> dict[str, Any]:
        """What the task tools recorded under ``marker``: runs, started, cancelled (foreground)."""
        keys = [marker, marker + "/cancelled"]
        runs, cancelled = await store.get_many(keys, collection=RUNS)
        return {"runs": runs, "cancelled": cancelled}

    @mcp.tool(task=TaskConfig(mode="required"))
    async def required_echo(text: str) -> str:
        return f"required {text}"

    @mcp.tool(task=TaskConfig(mode="forbidden"))
    async def plain_echo(text: str) -> str:
        return f"plain {text}"

    @mcp.tool(task=True)
    async def whoami() -> dict[str, Any]:
        token = get_access_token()
        headers = get_http_headers(include_all=True)
        return {"client_id": None if token is None else token.client_id, "marker": headers.get("x-marker")}

    @mcp.tool(task=True)
    async def ask(ctx: Context) -> str | InputRequiredResult:
        """The guard pattern: asks a name, then greets it."""
        import mcp_types

        answers = ctx.input_responses
        if not answers:
            request = mcp_types.ElicitRequest(
                params=mcp_types.ElicitRequestFormParams(
                    message="your name?",
                    requested_schema={"type": "object", "properties": {"name": {"type": "string"}}},
                )
            )
            return InputRequiredResult(input_requests={"name": request})
        answer = answers["name"]
        return f"hello {getattr(answer, 'content', {}).get('name')}"

    @mcp.custom_route("/health", methods=["GET"])
    async def health(request: Request) -> PlainTextResponse:
        import os

        return PlainTextResponse(f"tasks {os.getpid()}")  # which process answers: a port may be taken meanwhile

    return mcp


def _add_run(old: dict[str, Any] | None) -> dict[str, Any]:
    import os

    return {"runs": (old or {"runs": 0})["runs"] + 1, "pid": os.getpid()}


class TaskWire(TaskClient):
    """:class:`kvstores.tasks.TaskClient` whose calls return whole JSON-RPC responses (errors too), for the tests."""

    async def request(self, method: str, params: dict[str, Any], *, declare: bool = True) -> dict[str, Any]:
        """Send one request; return its JSON-RPC response (with ``result`` or ``error``)."""
        return await self.respond(method, params, declare=declare)

    async def call(self, name: str, arguments: dict[str, Any], *, declare: bool = True) -> dict[str, Any]:
        """``tools/call``: a CreateTaskResult (``resultType: "task"``), a CallToolResult, or an error response."""
        return await self.request("tools/call", {"name": name, "arguments": arguments}, declare=declare)

    async def submit(self, name: str, arguments: dict[str, Any]) -> str:
        """``tools/call`` that must create a task; its id."""
        answer = await self.call(name, arguments)
        result = answer["result"]
        assert result["resultType"] == "task", answer
        task_id: str = result["taskId"]
        return task_id

    async def wait(
        self,
        task_id: str,
        *,
        until: tuple[str, ...] = ("completed", "failed", "cancelled"),
        within: float = 30,
        pause: float = 0.05,
    ) -> dict[str, Any]:
        """Poll ``tasks/get`` until the task's status is one of ``until``; its last result."""
        deadline = time.monotonic() + within
        while True:
            answer = await self.get(task_id)
            assert "result" in answer, answer
            if answer["result"]["status"] in until:
                result: dict[str, Any] = answer["result"]
                return result
            assert time.monotonic() < deadline, f"task still {answer['result']['status']} after {within} s"
            await asyncio.sleep(pause)


class ThreadServer:
    """A uvicorn server for ``app`` on a thread of this process (its own loop), on a free port."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


class TaskServer:
    """This module run as a server (or worker) process on a store; it can be killed, frozen and restarted."""

    def __init__(
        self, store_url: str, options: dict[str, Any], log_dir: Path, *, extra: list[str] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.args = ["--port", str(self.port), "--store", store_url, "--options", json.dumps(options), *(extra or [])]
        self.log = log_dir / f"task-server-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> TaskServer:
        """Start the process and wait until it serves HTTP (a worker-only process: until it logs that it runs)."""
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.tasks", *self.args], cwd=ROOT, stdout=log, stderr=log
            )
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited with {self.process.returncode}:\n{self.log.read_text()}")
            if "--no-http" in self.args:
                if "worker running" in self.log.read_text():
                    return self
            else:
                try:
                    answer = httpx2.get(f"http://127.0.0.1:{self.port}/health", timeout=1)
                    if answer.text == f"tasks {self.process.pid}":
                        return self
                except httpx2.TransportError:
                    pass
            assert time.monotonic() < deadline, f"server did not start:\n{self.log.read_text()}"
            time.sleep(0.05)

    def signal(self, number: int) -> None:
        """Send a signal (SIGKILL, SIGSTOP, SIGCONT) to the process."""
        assert self.process is not None
        self.process.send_signal(number)
        if number == 9:
            self.process.wait()

    def stop(self) -> None:
        """SIGCONT (in case it is frozen), SIGTERM, then SIGKILL."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(18)
            stop_process(self.process, timeout=5)


async def run_log(wire: TaskWire, marker: str) -> dict[str, Any]:
    """What the task tools recorded under ``marker``, asked through the server (a foreground call)."""
    answer = await wire.call("run_log", {"marker": marker}, declare=False)
    log: dict[str, Any] = answer["result"]["structuredContent"]
    return log


async def started(wire: TaskWire, marker: str, within: float = 30) -> None:
    """Return once the task tool run under ``marker`` has started (it records its runs in the store)."""
    deadline = time.monotonic() + within
    while not (await run_log(wire, marker))["runs"]:
        assert time.monotonic() < deadline, "the tool never started"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def replicas(servers: list[TaskServer]) -> AsyncIterator[list[TaskWire]]:
    """A client of each of ``servers`` (started or not); on exit the clients are closed and the servers stopped."""
    wires = [TaskWire(server.url) for server in servers]
    try:
        yield wires
    except BaseException as exc:
        for server in servers:
            if server.log.exists():
                log = server.log.read_text(errors="replace")
                exc.add_note(f"--- log of the server on port {server.port} ---\n{log}")
        raise
    finally:
        for wire in wires:
            await wire.aclose()
        for server in servers:
            server.stop()


def task_servers(
    backend: Backend, namespace: str, log_dir: Path, count: int, *extra: str, options: Any = None
) -> list[TaskServer]:
    """``count`` task servers (child processes, not started) on the row's store at ``namespace``."""
    url, defaults = backend.url(namespace)
    return [TaskServer(url, {**defaults, **(options or {})}, log_dir, extra=list(extra)) for _ in range(count)]


def main() -> None:
    import logging

    import uvicorn

    from kvstores import open_store

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--options", default="{}")
    parser.add_argument("--lease", type=float, default=None)
    parser.add_argument("--ttl", type=float, default=None)
    parser.add_argument("--no-http", action="store_true")
    parser.add_argument("--no-worker", action="store_true")
    parser.add_argument("--auth", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    options: dict[str, Any] = {"worker": not args.no_worker}
    if args.lease is not None:
        options["lease"] = args.lease
        options["rescan"] = min(args.lease / 2, 2.5)
    if args.ttl is not None:
        options["ttl"] = args.ttl
    store = open_store(args.store, **json.loads(args.options))
    mcp = build_server(store, auth=args.auth, **options)
    if args.no_http:
        from kvstores.tasks import serve_worker

        logging.getLogger("kvstores.tasks").info("worker running")
        asyncio.run(serve_worker(mcp))
        return
    uvicorn.run(mcp.http_app(), host="127.0.0.1", port=args.port, log_level="warning", timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
