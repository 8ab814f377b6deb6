"""Replicas that talk (DESIGN §8): three uvicorn processes behind HAProxy (round-robin, no stickiness).

On each persistent backend, three server processes (tests.support.sessions) share one store and
HAProxy spreads every request over them. A handshake client (FastMCP's, and the MCP SDK's own)
runs a paced streaming tool; its stream is cut mid-call and the client resumes, wherever the
proxy sends it:

- the client aborts its connection, or the proxy drops every connection: every notification
  and the result arrive exactly once and in order (the resumed stream follows the runner's
  events through the store, live);
- the replica running the call is SIGKILLed: the client gets a JSON-RPC error saying the
  server stopped, within the runner's lease + 1 s, not its own timeout.

And a DELETE on one replica is refused by every replica as soon as it has answered.

Cost (about two minutes on two idle cores): every cut kind 3 times with FastMCP's client on
SQLite and Redis, and with the SDK's client too (its SIGKILL case, 4 s a repetition for the lease
to lapse, on Redis only); on PostgreSQL, MongoDB and MariaDB, FastMCP's client through a proxy
drop and a SIGKILL (to the server, a client abort is a drop too); the termination test on every
row. One cluster runs at a time.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from kvstores.events import LEASE_TTL, STOPPED_MESSAGE, UNSETTLED_MESSAGE
from tests.support import Backend, Unavailable, marker
from tests.support.events import PROTOCOL_VERSION, RawSession, sse_events
from tests.support.fixtures import rows_with, skip_or_fail, start_row
from tests.support.haproxy import REPLICA_HEADER, HAProxy
from tests.support.sessions import SessionServer

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

STEPS = 6
PAUSE = 0.1
"""The tool reports STEPS steps PAUSE seconds apart..."""

CUT_AT = 2
"""...and its stream is cut once the client has step CUT_AT."""

REPEAT = 3

FAIL_FAST_WITHIN = LEASE_TTL + 1 + 1 + 2
"""Seconds from the SIGKILL to the client's error: the lease, the follower's grace and poll, the retry, and
the end record's write (at most 2 s before the follower gives it up and answers UNSETTLED_MESSAGE)."""

TERMINATION_ROUNDS = 20
"""DELETEs in the termination test, each followed at once by a request to every replica."""

FULL = ("sqlite", "redis")
"""Rows where the SDK's client runs too (the other rows: FastMCP's client only)."""


@dataclass
class Cluster:
    """Three replicas on one store behind one proxy."""

    name: str
    servers: list[SessionServer]
    proxy: HAProxy
    latencies: list[float] = field(default_factory=list)

    def replica(self, name: str) -> SessionServer:
        return self.servers[self.proxy.names.index(name)]


async def _destroy(backend: Backend, namespace: str) -> None:
    store = await backend.open(namespace)
    await store.destroy()
    await store.aclose()


@contextmanager
def _started(backend: Backend, work: Path) -> Iterator[Cluster]:
    """Three replicas on a fresh namespace of ``backend`` behind HAProxy; stopped, and the namespace dropped, after."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    url, options = backend.url(namespace)
    servers = [SessionServer(url, options, work) for _ in range(3)]
    try:
        proxy = HAProxy([server.port for server in servers], work)
    except Unavailable as exc:
        skip_or_fail(marker(backend.name), str(exc))  # CI installs it (.ci/run) and requires every backend
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_until_serving()
        proxy.start()
        yield Cluster(backend.name, servers, proxy)
    finally:
        proxy.stop()
        for server in servers:
            server.stop()
        asyncio.run(_destroy(backend, namespace))


@pytest.fixture(scope="module")
def running() -> Iterator[dict[str, Any]]:
    """The one cluster up at a time: its row's name, the cluster, and the stack that stops it."""
    current: dict[str, Any] = {}
    yield current
    if "stack" in current:
        current["stack"].close()


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest,
    running: dict[str, Any],
    started: dict[str, Backend | str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Cluster:
    """The cluster of row ``request.param``, started when the previous test used another row (tests come by row)."""
    if running.get("name") != request.param:
        if "stack" in running:
            running.pop("stack").close()
            running.clear()
        backend = start_row(request.param, started)
        with ExitStack() as stack:
            running["cluster"] = stack.enter_context(_started(backend, tmp_path_factory.mktemp("replicas")))
            running["stack"], running["name"] = stack.pop_all(), request.param
    cluster: Cluster = running["cluster"]
    return cluster


class _Aborting(httpx2.AsyncByteStream):
    """A response body that the client abandons after ``events`` SSE events, closing its connection."""

    def __init__(self, inner: Any, events: int) -> None:
        self.inner = inner
        self.events = events

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self.inner:
            yield chunk
            seen += chunk.count(b"\r\n\r\n") + chunk.count(b"\n\n")
            if seen >= self.events:
                await self.inner.aclose()
                raise httpx2.ReadError("the test client aborted the stream")

    async def aclose(self) -> None:
        await self.inner.aclose()


class Wire(httpx2.AsyncBaseTransport):
    """The client's HTTP: notes the replica serving the tool call; can abort its stream after some events."""

    def __init__(self) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.runner: str | None = None
        self.resumed_on: list[str | None] = []
        self.abort_after: int | None = None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        streamed = response.headers.get("content-type", "").startswith("text/event-stream")
        if request.method == "GET" and "last-event-id" in request.headers:
            self.resumed_on.append(response.headers.get(REPLICA_HEADER))
        if request.method == "POST" and streamed and b'"tools/call"' in request.content:
            self.runner = response.headers.get(REPLICA_HEADER)
            if self.abort_after is not None:
                response.stream = _Aborting(response.stream, self.abort_after)
                self.abort_after = None
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def expected() -> list[tuple[str, str]]:
    return [note for step in range(1, STEPS + 1) for note in (("progress", f"step {step}"), ("log", f"log {step}"))]


@dataclass
class Outcome:
    notes: list[tuple[str, str]]
    result: str | None
    error: str | None
    cut: float | None
    ended: float
    runner: str | None
    resumed_on: list[str | None]


@asynccontextmanager
async def fastmcp_session(url: str, wire: Wire, notes: list[tuple[str, str]], on_step: Any) -> AsyncIterator[Any]:
    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append(("progress", str(message)))
        await on_step(str(message))

    async def on_log(message: Any) -> None:
        notes.append(("log", message.data["msg"]))

    def factory(**options: Any) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(**{"timeout": 30, **options, "transport": wire})

    transport = StreamableHttpTransport(url, httpx_client_factory=factory)
    async with Client(transport, mode="legacy", progress_handler=on_progress, log_handler=on_log) as client:

        async def call() -> str:
            result = await client.call_tool("stream_steps", {"steps": STEPS, "pause": PAUSE})
            return str(result.data)

        yield call


@asynccontextmanager
async def sdk_session(url: str, wire: Wire, notes: list[tuple[str, str]], on_step: Any) -> AsyncIterator[Any]:
    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append(("progress", str(message)))
        await on_step(str(message))

    async def on_log(params: Any) -> None:
        notes.append(("log", params.data["msg"]))

    async with (
        httpx2.AsyncClient(transport=wire, timeout=30) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write, logging_callback=on_log) as session,
    ):
        await session.initialize()

        async def call() -> str:
            result = await session.call_tool(
                "stream_steps", {"steps": STEPS, "pause": PAUSE}, progress_callback=on_progress
            )
            if result.is_error:
                raise RuntimeError(str(result.content))
            return str(result.content[0].text)  # type: ignore[union-attr]

        yield call


SESSIONS = {"fastmcp": fastmcp_session, "sdk": sdk_session}


async def call_and_cut(cluster: Cluster, client: str, cut: str) -> Outcome:
    """Run the streaming tool through the proxy, cut its stream at step CUT_AT as ``cut`` says."""
    wire = Wire()
    notes: list[tuple[str, str]] = []
    cut_at: list[float] = []
    restarts: list[threading.Thread] = []
    if cut == "abort":
        wire.abort_after = 1 + 2 * CUT_AT  # the priming event, then a progress and a log per step

    async def on_step(message: str) -> None:
        if message != f"step {CUT_AT}" or cut_at:
            return
        if cut == "drop":
            cluster.proxy.drop_connections()
        elif cut == "kill":
            assert wire.runner is not None
            cluster.replica(wire.runner).kill()
            # Back in the time the client waits for its error (the dead process's lease is not renewed).
            restarts.append(threading.Thread(target=_restart, args=(cluster, wire.runner)))
            restarts[-1].start()
        cut_at.append(time.monotonic())

    result = error = None
    async with SESSIONS[client](cluster.proxy.url, wire, notes, on_step) as call:
        try:
            with anyio.fail_after(30):
                result = await call()
        except TimeoutError:
            raise
        except Exception as exc:
            error = str(exc)
        ended = time.monotonic()
    for restart in restarts:
        await anyio.to_thread.run_sync(restart.join)
    return Outcome(notes, result, error, cut_at[0] if cut_at else None, ended, wire.runner, wire.resumed_on)


def _restart(cluster: Cluster, name: str) -> None:
    server = cluster.replica(name)
    server.start()
    server.wait_until_serving()
    cluster.proxy.wait_until_up(name)


_CUTS = {
    **{(name, "fastmcp"): ("abort", "drop", "kill") for name in FULL},
    ("sqlite", "sdk"): ("abort", "drop"),
    ("redis", "sdk"): ("abort", "drop", "kill"),
}
"""The cut kinds of the FULL rows' (row, client) pairs; every other row runs a drop and a kill with
FastMCP's client (an abort is the same as a drop to the server, and a kill takes 4 s)."""


def _cases() -> list[Any]:
    cases = []
    for row in rows_with("persistent", "processes"):  # every kind of store several processes share
        (name,) = row.values
        cases.append(pytest.param(name, "http", "delete", marks=row.marks, id=f"{name}-delete"))
        cases.append(pytest.param(name, "http", "freeze", marks=row.marks, id=f"{name}-freeze"))
        for client in ("fastmcp", "sdk") if name in FULL else ("fastmcp",):
            for cut in _CUTS.get((name, client), ("drop", "kill")):
                cases.append(pytest.param(name, client, cut, marks=row.marks, id=f"{name}-{client}-{cut}"))
    return cases


@pytest.mark.parametrize(("cluster", "client", "scenario"), _cases(), indirect=["cluster"])
async def test_three_replicas_behind_haproxy(cluster: Cluster, client: str, scenario: str) -> None:
    """One row's cases in a row, on one cluster: a DELETE refused everywhere, then each cut, 3 times."""
    if scenario == "delete":
        await a_delete_is_refused_by_every_replica_at_once(cluster)
    elif scenario == "freeze":
        await a_frozen_runner_never_answers_a_request_answered_for_it(cluster)
    else:
        await a_cut_stream_resumes_on_any_replica(cluster, client, scenario)


async def a_cut_stream_resumes_on_any_replica(cluster: Cluster, client: str, cut: str) -> None:
    """Every notification and the result once and in order after an abort or a drop; an error soon after a kill."""
    elsewhere = 0
    for _ in range(REPEAT):
        outcome = await call_and_cut(cluster, client, cut)
        elsewhere += any(replica != outcome.runner for replica in outcome.resumed_on)
        print(
            f"\n{cluster.name} {client} {cut}: ran on {outcome.runner}, resumed on {outcome.resumed_on}, "
            f"ended {outcome.ended - (outcome.cut or 0):.2f} s after the cut"
        )
        assert outcome.cut is not None, f"the stream was never cut: {outcome}"
        if cut == "kill":
            assert outcome.result is None and outcome.error is not None and STOPPED_MESSAGE in outcome.error, outcome
            assert outcome.ended - outcome.cut < FAIL_FAST_WITHIN, outcome
            assert outcome.notes == expected()[: len(outcome.notes)], outcome  # in order, none twice
        else:
            assert (outcome.notes, outcome.result, outcome.error) == (expected(), "done", None)
    assert elsewhere, "the proxy never sent a resumption to another replica than the runner"


async def _status(http: httpx.AsyncClient, url: str, session_id: str, method: str = "POST") -> int:
    headers = {
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": PROTOCOL_VERSION,
        "mcp-session-id": session_id,
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with http.stream(method, url, headers=headers, **({"json": body} if method == "POST" else {})) as response:
        await response.aread()
        return response.status_code


async def a_delete_is_refused_by_every_replica_at_once(cluster: Cluster) -> None:
    """A DELETE on one replica, then at once a request with the id to every replica, directly and through
    the proxy: every one is refused (404), whatever the signal channel has delivered yet (20 rounds)."""
    a = cluster.servers[0]
    async with httpx.AsyncClient(timeout=10) as http:
        for _ in range(TERMINATION_ROUNDS):
            session = await RawSession(http, a.url).open()
            for server in cluster.servers:  # every replica holds the session: a warm session everywhere
                assert await _status(http, server.url, session.session_id) == 200
            assert await _status(http, a.url, session.session_id, method="DELETE") == 200
            urls = [*(server.url for server in reversed(cluster.servers)), cluster.proxy.url]
            served = {url: await _status(http, url, session.session_id) for url in urls}
            assert set(served.values()) == {404}, f"served after a DELETE that answered: {served}"


FROZEN_STEPS = 40
"""The frozen call's steps (PAUSE apart): it would still be running when its runner is thawed."""

FROZEN_RESUMPTIONS = 6
"""Resumptions after the thaw, through the proxy: each replica serves two."""


async def _resume(http: httpx.AsyncClient, url: str, session: RawSession, last_event_id: str) -> list[Any]:
    """The messages (and their ids) of a GET that resumes after ``last_event_id``, to the end of its response."""
    sent: list[Any] = []
    with anyio.fail_after(FAIL_FAST_WITHIN + 5):
        async with session.http.stream("GET", url, headers=session.headers(**{"last-event-id": last_event_id})) as r:
            assert r.status_code == 200, await r.aread()
            async for event in sse_events(r):
                if event.get("data"):
                    sent.append((event.get("id"), json.loads(event["data"])))
    return sent


async def a_frozen_runner_never_answers_a_request_answered_for_it(cluster: Cluster) -> None:
    """SIGSTOP the replica running a call past its lease: the client resumes elsewhere and is told the call
    stopped; SIGCONT it: resuming again (from the same id, on any replica) never brings another event or a
    second answer, and the call was cancelled (its side effect never happened)."""
    url, counter = cluster.proxy.url, uuid.uuid4().hex
    async with httpx.AsyncClient(timeout=30) as http:
        session = await RawSession(http, url).open()
        arguments = {"steps": FROZEN_STEPS, "pause": PAUSE, "counter": counter}
        notes, last = 0, ""
        async with session.call(7, "counted_steps", arguments) as response:
            runner = response.headers[REPLICA_HEADER]
            async for event in sse_events(response):
                last = event.get("id", last)
                notes += bool(event.get("data"))
                if notes == 2 * CUT_AT:
                    break  # the client's connection drops
        process = cluster.replica(runner).process
        assert process is not None
        process.send_signal(signal.SIGSTOP)  # it keeps its sockets, sessions and locks, and does nothing
        cluster.proxy.command(f"disable server replicas/{runner}")  # what its health check would soon see
        frozen = time.monotonic()
        try:
            answer = await _resume(http, url, session, last)
            stopped = time.monotonic() - frozen
        finally:
            process.send_signal(signal.SIGCONT)
            cluster.proxy.command(f"enable server replicas/{runner}")
        print(f"\n{cluster.name}: frozen runner {runner} answered for after {stopped:.2f} s: {answer[-1]}")
        *_, (end_id, end) = answer
        assert end["id"] == 7 and end["error"]["message"] in (STOPPED_MESSAGE, UNSETTLED_MESSAGE), answer
        assert stopped < FAIL_FAST_WITHIN, answer
        await anyio.sleep(FROZEN_STEPS * PAUSE)  # the time the thawed runner would need to finish the call
        recorded = answer if end_id is not None else None  # UNSETTLED: the runner records the end when thawed
        for _ in range(FROZEN_RESUMPTIONS):
            again = await _resume(http, url, session, last)
            recorded = recorded or again
            assert again == recorded and again[:-1] == answer[:-1], (answer, again)
            assert again[-1][1]["error"]["message"] == STOPPED_MESSAGE and again[-1][1]["id"] == 7, again
            assert await _resume(http, url, session, again[-1][0]) == []
        body = RawSession.request(8, "tools/call", {"name": "count", "arguments": {"counter": counter}})
        async with http.stream("POST", url, json=body, headers=session.headers()) as response:
            results = [json.loads(event["data"]) async for event in sse_events(response) if event.get("data")]
        assert results[-1]["result"]["content"][0]["text"] == "0", results  # cancelled: it never completed
