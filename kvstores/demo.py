"""``kvstores demo``: FastMCP session state on a kvstores store, step by step.

Runs a real FastMCP server (in-process, see :mod:`kvstores.harness`) on the
store at ``--store`` (default: an SQLite file in the working directory) and shows, in a
few seconds: handshake sessions kept apart and fresh on reconnect, ctx state expiring on
its TTL, and an explicit session surviving a server restart. Between phases the server
is restarted: the store is closed and opened again from its URL, and a new FastMCP is
built on it.

The last scene runs three real server processes (``python -m kvstores._demo_server``, uvicorn
serving :func:`kvstores.sessions.http_app` on the same store, on free loopback ports): a
streaming call on the first whose stream is cut mid-call resumes on the third, which follows
it to its result; a handshake session opened on the first continues, state and all, on the
second once the first is killed, and is refused after the client closes it. Then two fresh
server processes run a background task (``kvstores.tasks``): submitted through one, known to the
other at once; the server running it is killed, and the task finishes on the other.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kvstores._loopback import bound_socket
from kvstores._optional import missing_extra
from kvstores._urls import redact
from kvstores.errors import KVStoreError
from kvstores.harness import FASTMCP_STATE_COLLECTION, connected_client, state_server
from kvstores.protocol import AsyncKeyValue
from kvstores.registry import URL_VARIABLE, open_store

try:
    import httpx2
    from fastmcp import Client
    from fastmcp.client.transports import StreamableHttpTransport
    from fastmcp.exceptions import ToolError
    from key_value.aio.wrappers.ttl_clamp import TTLClampWrapper
    from mcp.shared.exceptions import MCPError

    from kvstores._demo_server import TASK_LEASE, TASK_RESCAN
    from kvstores.tasks import TaskClient
    from kvstores.tasks._record import label, ref
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("fastmcp", "fastmcp") from exc

__all__ = ["DEFAULT_STORE", "main"]

DEFAULT_STORE = "sqlite:///kvstores-demo.db"
"""The store the demo uses unless given ``--store``: a file in the working directory."""

_EXPIRY_SECONDS = 1.0

_SERVER_START_SECONDS = 30.0
"""How long a server process may take to start serving (importing fastmcp is most of it)."""

_SERVER_STOP_SECONDS = 5.0
"""How long a server process may take to exit after SIGTERM before it is killed."""

_HTTP_TIMEOUT_SECONDS = 10.0


class _Demo:
    """Prints each step and what it showed; counts the surprises."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.label = redact(url)
        """The store's URL as the demo prints it: without credentials."""
        self.restarts = 0
        self.surprises = 0

    @asynccontextmanager
    async def server_store(self, title: str) -> AsyncIterator[Any]:
        """Open the store afresh for the next phase (a server restart after the first)."""
        if self.restarts:
            print("\n-- server restarted: store closed and opened again from its URL, new FastMCP --")
        self.restarts += 1
        print(f"\n[server {self.restarts}] {title}")
        async with open_store(self.url) as store:
            yield store

    def step(self, what: str) -> None:
        """Print one step."""
        print(f"  {what}")

    def check(self, ok: bool, shown: str) -> None:
        """Print what a step showed, flagged when it is not what a working store shows."""
        if not ok:
            self.surprises += 1
        print(f"    {'ok' if ok else 'UNEXPECTED'}: {shown}")


async def _call(client: Client[Any], tool: str, **arguments: Any) -> Any:
    return (await client.call_tool(tool, arguments)).data


async def _session(client: Client[Any]) -> str:
    return str((await _call(client, "list_session_info"))["session_id"])


async def _handshake_sessions(demo: _Demo) -> None:
    async with demo.server_store("handshake sessions: ctx.set_state / ctx.get_state (mode='legacy')") as store:
        server = state_server(store)
        async with Client(server, mode="legacy") as alice:
            demo.step(f"Alice connects: session {(await _session(alice))[:8]}")
            await _call(alice, "set_value", key="user", value="Alice")
            await _call(alice, "set_value", key="secret", value="alice-password")
            demo.step("Alice sets user='Alice', secret='alice-password'")
            user, secret = await _call(alice, "get_value", key="user"), await _call(alice, "get_value", key="secret")
            demo.step(f"Alice reads user -> {user!r}, secret -> {secret!r}")
            demo.check((user, secret) == ("Alice", "alice-password"), "state persists across calls in a session")
        async with Client(server, mode="legacy") as bob:
            demo.step(f"Bob connects: session {(await _session(bob))[:8]}")
            user, secret = await _call(bob, "get_value", key="user"), await _call(bob, "get_value", key="secret")
            demo.step(f"Bob reads user -> {user!r}, secret -> {secret!r}")
            demo.check((user, secret) == (None, None), "sessions are isolated: Bob sees none of Alice's state")
            await _call(bob, "set_value", key="user", value="Bob")
            user = await _call(bob, "get_value", key="user")
            demo.step(f"Bob sets user='Bob' and reads user -> {user!r}")
            demo.check(user == "Bob", "same key, different value per session")
        async with Client(server, mode="legacy") as alice_again:
            demo.step(f"Alice reconnects: session {(await _session(alice_again))[:8]}")
            user = await _call(alice_again, "get_value", key="user")
            demo.step(f"Alice reads user -> {user!r}")
            demo.check(user is None, "a reconnect starts a fresh session")


async def _expiry(demo: _Demo) -> None:
    async with demo.server_store("expiry: ctx state is written with a TTL") as store:
        async with connected_client(store) as client:
            session_id = await _session(client)
            await _call(client, "set_value", key="user", value="Alice")
            _, remaining = await store.ttl(f"{session_id}:user", collection=FASTMCP_STATE_COLLECTION)
            demo.step(f"set user='Alice'; the store reports it expires in {remaining or 0:,.0f} s")
            demo.check(remaining is not None and remaining > 86_000, "FastMCP's one-day TTL reached the store")
        capped: AsyncKeyValue = TTLClampWrapper(store, min_ttl=_EXPIRY_SECONDS, max_ttl=_EXPIRY_SECONDS)
        demo.step(f"cap the store's TTLs at {_EXPIRY_SECONDS:g} s (py-key-value's TTLClampWrapper) and reconnect")
        async with connected_client(capped) as client:
            await _call(client, "set_value", key="user", value="Alice")
            demo.step(f"set user='Alice'; read at once -> {await _call(client, 'get_value', key='user')!r}")
            await asyncio.sleep(_EXPIRY_SECONDS + 0.5)
            user = await _call(client, "get_value", key="user")
            demo.step(f"{_EXPIRY_SECONDS + 0.5:g} s later, read -> {user!r}")
            demo.check(user is None, "the state expired on its TTL")


async def _explicit_session(demo: _Demo) -> str:
    async with demo.server_store("explicit session: SessionProvider, session_id: SessionId (any mode)") as store:
        server = state_server(store)
        async with Client(server) as first:
            session_id: str = await _call(first, "create_session")
            await _call(first, "remember", session_id=session_id, key="user", value="Alice")
            demo.step(f"connection 1: create_session -> {session_id[:8]}..., remember user='Alice'")
        async with Client(server) as second:
            user = await _call(second, "recall", session_id=session_id, key="user")
            demo.step(f"connection 2: recall user -> {user!r}")
            demo.check(user == "Alice", "an explicit session is shared between connections")
    return session_id


async def _after_restart(demo: _Demo, session_id: str) -> None:
    persistent = not _in_process(demo.url)
    async with (
        demo.server_store("the explicit session after the restart") as store,
        connected_client(store, mode="auto") as client,
    ):
        found = await client.call_tool("recall", {"session_id": session_id, "key": "user"}, raise_on_error=False)
        shown = "unknown session" if found.is_error else repr(found.data)
        demo.step(f"recall user from session {session_id[:8]}... -> {shown}")
        if persistent:
            demo.check(found.data == "Alice", "the session survived the server restart")
            await _call(client, "end_session", session_id=session_id)
            demo.step("end_session: its state is deleted from the store")
        else:
            demo.check(found.is_error, f"{demo.label} keeps nothing once closed, so the session is gone")


async def _durable_session(demo: _Demo) -> None:
    print("\n[servers A and B] durable sessions: a handshake session moves to another process (kvstores.sessions)")
    if not _can_run_processes(demo):
        return
    demo.step(f"three uvicorn processes serve kvstores.sessions.http_app on {demo.label}:")
    async with _server_processes(demo.url, "A", "B", "C") as (a, b, c):
        for server in (a, b, c):
            demo.step(f"  server {server.name} (pid {server.process.pid}) on {server.url}")
        balancer = _Balancer(a)
        async with _legacy_client(balancer) as client:
            session_id = await _session(client)
            await _call(client, "set_value", key="user", value="Alice")
            answered_by = await _call(client, "server_name")
            demo.step(f"server {answered_by}: a handshake client (mode='legacy') opens session {session_id}")
            demo.step(f"server {answered_by}: the client sets user='Alice'")
            await _stream_moves(demo, client, balancer, c)
            balancer.server = a
            a.kill()
            balancer.server = b
            demo.step("server A is killed; the client's next requests go to server B, which has never seen the session")
            try:
                answered_by, continued = await _call(client, "server_name"), await _session(client)
                user = await _call(client, "get_value", key="user")
            except MCPError as exc:
                demo.check(False, f"server B refused the session: {exc}")
                return
            demo.step(f"server {answered_by}: session {continued}, the client reads user -> {user!r}")
            demo.check(
                (answered_by, continued) == ("B", session_id),
                "the same session continued on server B (adopted from the session registry on the store)",
            )
            demo.check(user == "Alice", "the state set on server A was read back on server B")
        demo.step(f"server B: the client closes the session: DELETE -> {balancer.closed_with}")
        refused = await _post_in_session(b.url, session_id)
        demo.step(f"server B: a request in session {session_id} -> {refused.status_code} {_error_message(refused)}")
        demo.check(refused.status_code == 404, "a closed session is refused: its id cannot be used again")


async def _task_moves(demo: _Demo) -> None:
    print("\n[servers A and B] background tasks: a task whose server is killed finishes on another (kvstores.tasks)")
    if not _can_run_processes(demo):
        return
    async with _server_processes(demo.url, "A", "B") as servers, TaskClient(servers[0].url) as via_a:
        demo.step(f"two fresh uvicorn processes, A and B, serve the same tools and run task workers on {demo.label}")
        task_id = await via_a.submit("write_report", {"seconds": 2.0})
        demo.step(
            f"server A: the client calls write_report(seconds=2) as a background task -> task {label(ref(task_id))}"
        )
        async with TaskClient(servers[1].url) as via_b:
            known = (await via_b.get(task_id))["status"]
        demo.check(known == "working", f"server B knows the task at once, from the store: {known}")
        task = await via_a.wait(task_id, until=("working",), within=10)
        while not task.get("statusMessage"):
            task = await via_a.get(task_id)
            await asyncio.sleep(0.05)
        runner = next(server for server in servers if task["statusMessage"].endswith(f"server {server.name}"))
        other = next(server for server in servers if server is not runner)
        demo.step(f"server {other.name} answers tasks/get: {task['statusMessage']!r}")
        runner.kill()
        started = time.monotonic()
        demo.step(
            f"server {runner.name} is killed mid-task; its lease ({TASK_LEASE:g} s here, 10 s by default) runs out "
            f"and, once a rescan ({TASK_RESCAN:g} s) has seen it lapsed for half a lease, hands the task to server "
            f"{other.name}'s worker"
        )
        async with TaskClient(other.url) as survivor:
            result = await survivor.result(task_id, within=30)
        text = result["content"][0]["text"]
        demo.step(f"server {other.name}: the task completed after {time.monotonic() - started:.1f} s -> {text!r}")
        demo.check(
            text == f"report written by server {other.name}",
            f"the task server {runner.name} was running when it died ran again on server {other.name}, "
            "and the client got its result",
        )


def _can_run_processes(demo: _Demo) -> bool:
    """Whether server processes can share the demo's store (it says why not otherwise)."""
    if _in_process(demo.url):
        demo.step(f"skipped: {demo.label} lives inside one process, so two server processes cannot share it")
        return False
    if importlib.util.find_spec("uvicorn") is None:
        demo.step("skipped: uvicorn is not installed (it comes with fastmcp)")
        return False
    return True


_COUNT = 6
_CUT_AFTER = 2


async def _stream_moves(demo: _Demo, client: Client[Any], balancer: _Balancer, other: _ServerProcess) -> None:
    """A streaming call on the balancer's server, cut after _CUT_AFTER steps, resumes on ``other`` and ends there."""
    runner = balancer.server.name
    demo.step(f"server {runner}: the client calls count_to({_COUNT}), a call that streams a progress step every 0.2 s")
    steps: list[str] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        steps.append(str(message))
        demo.step(f"  <- {message} (the client's stream comes from server {balancer.streaming_from})")

    balancer.cut_after = 1 + _CUT_AFTER  # the priming event, then one event per step
    balancer.then = other
    result = await client.call_tool("count_to", {"steps": _COUNT}, progress_handler=progress)
    demo.step(f"  <- result: {result.data!r} (on the stream from server {balancer.streaming_from})")
    expected = [f"step {step} (run by server {runner})" for step in range(1, _COUNT + 1)]
    demo.check(
        steps == expected and balancer.streaming_from == other.name,
        f"the stream was cut after step {_CUT_AFTER}; the client resumed on server {other.name}, which followed the "
        f"call still running on server {runner} through the store: every step once, in order, and the result",
    )


class _ServerFailed(Exception):
    """A server process of the durable-session scene exited, or did not start serving in time."""


class _ServerProcess:
    """``python -m kvstores._demo_server`` on a free loopback port, its output in a log file."""

    def __init__(self, name: str, store_url: str, log_dir: Path) -> None:
        self.name = name
        self.log = log_dir / f"server-{name}.log"
        environment = {**os.environ, URL_VARIABLE: store_url}  # not in argv, where ps would show credentials
        with bound_socket() as listener, self.log.open("wb") as log:  # the process listens on the socket
            self.port: int = listener.getsockname()[1]
            self.process = subprocess.Popen(
                [sys.executable, "-m", "kvstores._demo_server", "--fd", str(listener.fileno()), "--name", name],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                pass_fds=[listener.fileno()],
            )
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    async def wait_until_serving(self, deadline: float) -> None:
        """Return once the server accepts connections (uvicorn listens once its startup is done)."""
        while True:
            if self.process.poll() is not None:
                raise _ServerFailed(
                    f"server {self.name} exited with code {self.process.returncode}:\n{self._log_tail()}"
                )
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                if time.monotonic() > deadline:
                    raise _ServerFailed(f"server {self.name} did not start serving:\n{self._log_tail()}") from None
                await asyncio.sleep(0.05)
            else:
                writer.close()
                await writer.wait_closed()
                return

    def kill(self) -> None:
        """End the process at once: it hands nothing over at shutdown."""
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it is still running a few seconds later."""
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(_SERVER_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.kill()

    def _log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-10:])


@asynccontextmanager
async def _server_processes(store_url: str, *names: str) -> AsyncIterator[list[_ServerProcess]]:
    """Start one server process per name on ``store_url``, wait until all serve; stop them however the scene ends."""
    with tempfile.TemporaryDirectory(prefix="kvstores-demo-") as log_dir:
        servers: list[_ServerProcess] = []
        try:
            servers.extend(_ServerProcess(name, store_url, Path(log_dir)) for name in names)
            deadline = time.monotonic() + _SERVER_START_SECONDS
            for server in servers:
                await server.wait_until_serving(deadline)
            yield servers
        finally:
            for server in servers:
                server.stop()


class _Balancer(httpx2.AsyncBaseTransport):
    """The demo's load balancer: sends every request to ``server``, whatever port its URL names."""

    def __init__(self, server: _ServerProcess) -> None:
        self.server = server
        self.closed_with: int | None = None
        """The status of the client's DELETE, once it has closed its session."""
        self.cut_after: int | None = None
        """Cut the next streamed tool call's connection after this many events..."""
        self.then: _ServerProcess | None = None
        """...and send the requests after the cut to this server."""
        self.streaming_from = ""
        """The server whose stream the client reads now."""
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        server = self.server
        request.url = request.url.copy_with(port=server.port)
        response = await self._inner.handle_async_request(request)
        if request.method == "DELETE":
            self.closed_with = response.status_code
        if response.headers.get("content-type", "").startswith("text/event-stream") and (
            (request.method == "GET" and "last-event-id" in request.headers) or b'"tools/call"' in request.content
        ):
            self.streaming_from = server.name
            if self.cut_after is not None and request.method == "POST":
                response.stream = _Cut(response.stream, self.cut_after, self._moved)
                self.cut_after = None
        return response

    def _moved(self) -> None:
        if self.then is not None:
            self.server, self.then = self.then, None

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Cut(httpx2.AsyncByteStream):
    """A response body whose connection drops after ``events`` server-sent events (the network failed)."""

    def __init__(self, inner: Any, events: int, on_cut: Any) -> None:
        self.inner = inner
        self.events = events
        self.on_cut = on_cut

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self.inner:
            yield chunk
            seen += chunk.count(b"\r\n\r\n") + chunk.count(b"\n\n")
            if seen >= self.events:
                await self.inner.aclose()
                self.on_cut()
                raise httpx2.ReadError("the demo cut the connection")

    async def aclose(self) -> None:
        await self.inner.aclose()


def _legacy_client(balancer: _Balancer) -> Client[StreamableHttpTransport]:
    """A handshake-era client whose requests go wherever ``balancer`` points."""

    def http_client(
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
        **options: Any,
    ) -> httpx2.AsyncClient:
        timeout = timeout or httpx2.Timeout(_HTTP_TIMEOUT_SECONDS)
        return httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth, transport=balancer, **options)

    return Client(StreamableHttpTransport(balancer.server.url, httpx_client_factory=http_client), mode="legacy")


async def _post_in_session(url: str, session_id: str) -> httpx2.Response:
    """A tools/list request in session ``session_id``, as a client that kept the id would send it."""
    headers = {"accept": "application/json, text/event-stream", "mcp-session-id": session_id}
    async with httpx2.AsyncClient(timeout=_HTTP_TIMEOUT_SECONDS) as http:
        response: httpx2.Response = await http.post(
            url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=headers
        )
    return response


def _error_message(response: httpx2.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.reason_phrase


def _in_process(url: str) -> bool:
    """True for stores that live only as long as the store object (memory, SQLite :memory:)."""
    return urlsplit(url).scheme == "memory" or ":memory:" in url


async def _run(url: str) -> int:
    demo = _Demo(url)
    print(f"kvstores demo: FastMCP session state on {redact(url)}")
    try:  # first: the servers' tools would log every failure of an unreachable store as a traceback
        async with open_store(url) as store:
            await store.ping()
    except KVStoreError as exc:
        print(f"\ndemo stopped: cannot reach the store: {exc}")
        return 1
    try:
        await _handshake_sessions(demo)
        await _expiry(demo)
        session_id = await _explicit_session(demo)
        await _after_restart(demo, session_id)
        await _durable_session(demo)
        await _task_moves(demo)
    except (KVStoreError, ToolError) as exc:
        print(f"\ndemo stopped: the store failed: {exc}")
        return 1
    except _ServerFailed as exc:
        print(f"\ndemo stopped: {exc}")
        return 1
    except (MCPError, httpx2.HTTPError) as exc:
        print(f"\ndemo stopped: a request to a server process failed: {exc!r}")
        return 1
    print("\nall steps showed what they should" if not demo.surprises else f"\n{demo.surprises} unexpected result(s)")
    if not _in_process(url):
        print(f"\nwhat the store holds now (tasks, sessions, streams), on one page:\n  {_dashboard_command(url)}")
    return 1 if demo.surprises else 0


def _dashboard_command(url: str) -> str:
    """The command that opens the dashboard of the demo's store (its URL redacted: type the password in)."""
    return f"kvstores dashboard {shlex.quote(redact(url))}"


def main(argv: list[str] | None = None) -> int:
    """Run the demo on ``--store URL``; return 0 when every step showed what it should."""
    parser = argparse.ArgumentParser(prog="kvstores demo", description="FastMCP session state, step by step.")
    parser.add_argument("--store", default=DEFAULT_STORE, help=f"kvstores URL (default: {DEFAULT_STORE})")
    options = parser.parse_args(argv)
    try:
        return asyncio.run(_run(options.store))
    except KeyboardInterrupt:
        print("\ndemo interrupted", file=sys.stderr)
        return 130
