"""Helpers for the durable-session tests: FastMCP servers in child processes on one store, and a client
whose requests go to whichever of them the test picks.

Run as a script, this module is the server: ``python -m tests.support.sessions --port P --store URL``
serves a FastMCP server (state in the store, events in a StoreEventStore on it) through
``kvstores.sessions.http_app`` with uvicorn.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
from fastmcp import Client, Context, FastMCP
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.server.auth.providers.jwt import StaticTokenVerifier
from mcp_types.version import LATEST_MODERN_VERSION
from starlette.requests import Request
from starlette.responses import PlainTextResponse

from tests.support import free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]

TOKENS = {"token-x": {"client_id": "principal-x", "scopes": []}, "token-y": {"client_id": "principal-y", "scopes": []}}
"""Bearer tokens of the servers started with ``auth=True``: two principals."""

SDK_SESSION_LOGGER = "mcp.server.streamable_http_manager"
"""The SDK session manager's logger: at INFO it names every session it opens."""


class SessionServer:
    """This module run as a server process on a fixed free port; it can be killed and started again."""

    def __init__(
        self, store_url: str, options: dict[str, Any], log_dir: Path, *, idle_ttl: float = 600, auth: bool = False
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.args = ["--port", str(self.port), "--store", store_url, "--options", json.dumps(options)]
        self.args += ["--idle-ttl", str(idle_ttl)] + (["--auth"] if auth else [])
        self.log = log_dir / f"server-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> SessionServer:
        """Start the process (do not wait for it)."""
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.sessions", *self.args], cwd=ROOT, stdout=log, stderr=log
            )
        return self

    def wait_until_serving(self, timeout: float = 60.0) -> None:
        """Block until the server answers HTTP; fail with its log if it exits or hangs."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited with {self.process.returncode}:\n{self.log.read_text()}")
            try:
                httpx2.get(f"http://127.0.0.1:{self.port}/health", timeout=1)
                return
            except httpx2.TransportError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"server did not start serving:\n{self.log.read_text()}") from None
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: the process dies with its sessions in memory, nothing shut down cleanly."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL (SIGCONT first: a process a test froze with SIGSTOP would only take the SIGKILL)."""
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)
            stop_process(self.process, timeout=5)


class Router(httpx2.AsyncBaseTransport):
    """An httpx2 transport that sends every request to the port in ``port``, whatever its URL says."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.url = request.url.copy_with(port=self.port)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def routed_client(router: Router, *, token: str | None = None) -> Client[Any]:
    """A FastMCP handshake-era client whose requests go wherever ``router`` points."""

    def factory(**options: Any) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(**{"timeout": 30, **options, "transport": router})

    url = f"http://127.0.0.1:{router.port}/mcp"
    return Client(StreamableHttpTransport(url, httpx_client_factory=factory, auth=token), mode="legacy")


def label(session_id: str) -> str:
    """How kvstores names a session in its logs and errors (README, security notes): never the id itself."""
    return "#" + hashlib.sha256(session_id.encode()).hexdigest()[:12]


def modern_client(url: str, *, token: str, session_id: str) -> Client[Any]:
    """A FastMCP 2026-07-28 (sessionless) client that sends ``session_id`` as its Mcp-Session-Id on every request."""
    transport = StreamableHttpTransport(url, headers={"mcp-session-id": session_id}, auth=token)
    return Client(transport, mode=LATEST_MODERN_VERSION)


def build_app(
    store: Any, *, idle_ttl: float = 600, auth: bool = False, registry_store: Any = None, durable: bool = True
) -> Any:
    """The server on ``store``: tools that set and read session state, long_task (its stream drops midway) and
    stream_steps (a paced stream).

    ``registry_store`` (default ``store``) is the store passed to http_app: a wrapper that counts calls.
    ``durable=False`` serves FastMCP's own ``mcp.http_app()`` behind :class:`kvstores.sessions.SessionIdGuard`
    instead of ``kvstores.sessions.http_app``.
    """
    from kvstores.events import StoreEventStore
    from kvstores.sessions import http_app
    from tests.support.events import DROP_AFTER, RECONNECT_MS, STEPS

    mcp = FastMCP("sessions", session_state_store=store, auth=StaticTokenVerifier(tokens=TOKENS) if auth else None)

    @mcp.tool
    async def long_task(ctx: Context) -> str:
        for step in range(1, STEPS + 1):
            await ctx.report_progress(step, STEPS, f"step {step}")
            await ctx.info(f"log {step}")
            if step == DROP_AFTER:
                await ctx.close_sse_stream()
        return "done"

    @mcp.tool
    async def stream_steps(steps: int, pause: float, ctx: Context) -> str:
        """A progress notification and a log line per step, ``pause`` seconds apart (the replica tests cut it)."""
        for step in range(1, steps + 1):
            await ctx.report_progress(step, steps, f"step {step}")
            await ctx.info(f"log {step}")
            await asyncio.sleep(pause)
        return "done"

    @mcp.tool
    async def counted_steps(steps: int, pause: float, counter: str, ctx: Context) -> str:
        """stream_steps that adds one to ``counter`` in the store once its last step is done: its side effect."""
        await stream_steps(steps, pause, ctx)
        await store.update(counter, _add_one, collection=COUNTERS)
        return "done"

    @mcp.tool
    async def count(counter: str) -> int:
        """How many counted_steps calls with ``counter`` completed."""
        value = await store.get(counter, collection=COUNTERS)
        return 0 if value is None else int(value["n"])

    @mcp.tool
    async def set_state(key: str, value: str, ctx: Context) -> str:
        await ctx.set_state(key, value)
        return ctx.session_id

    @mcp.tool
    async def get_state(key: str, ctx: Context) -> str | None:
        value: str | None = await ctx.get_state(key)
        return value

    @mcp.tool
    async def client_name(ctx: Context) -> str:
        params = ctx.session.client_params
        return "" if params is None else params.client_info.name

    @mcp.custom_route("/health", methods=["GET"])
    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    if not durable:
        from kvstores.sessions import SessionIdGuard

        return SessionIdGuard(mcp.http_app(event_store=StoreEventStore(store), retry_interval=RECONNECT_MS))
    return http_app(
        mcp,
        store=registry_store or store,
        event_store=StoreEventStore(store),
        idle_ttl=idle_ttl,
        retry_interval=RECONNECT_MS,
    )


COUNTERS = "test_counters"
"""The collection of counted_steps' counters."""


def _add_one(old: dict[str, Any] | None) -> dict[str, Any]:
    return {"n": (old or {"n": 0})["n"] + 1}


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--options", default="{}")
    parser.add_argument("--idle-ttl", type=float, default=600)
    parser.add_argument("--auth", action="store_true")
    args = parser.parse_args()
    from kvstores import open_store

    # What a production process logs (WARNING and up), plus everything kvstores logs and the
    # SDK session manager's INFO lines (which name sessions): the tests read it to check that
    # no session id is ever logged whole.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    logging.getLogger("kvstores").setLevel(logging.DEBUG)
    logging.getLogger(SDK_SESSION_LOGGER).setLevel(logging.INFO)

    app = build_app(open_store(args.store, **json.loads(args.options)), idle_ttl=args.idle_ttl, auth=args.auth)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
