"""A client that resumes while the server goes on sending loses nothing.

The MCP SDK replays stored events on a resuming GET, then mints a priming event, then registers
the stream for live messages; a message the server routes to the stream in between is stored
but not sent on that connection (the SDK's own source calls it the replay->live window). A slow
event store widens that window. Here a tool closes its response stream and at once sends a burst
of notifications and its result, and the client resumes straight away, many times over: every
notification and the result must arrive, once each, on the resumed stream.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from fastmcp import Context, FastMCP
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http import EventMessage, EventStore
from starlette.applications import Starlette

import kvstores.events
import kvstores.signals
from kvstores import MemoryStore
from kvstores.conformance.events import notification, replay, wire
from kvstores.events import InMemoryEventStore, StoreEventStore
from tests.support.events import RECONNECT_MS, FlakyStore, RawSession, note_of, sdk_starlette, serving, sse_events

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

RESUMPTIONS = 15
"""Resumptions per test: each one a fresh chance to hit the window."""

BURST = 12
"""Notifications the tool sends after closing its stream, before its result."""

SPACING = 0.002
"""Seconds between two of them: the burst lasts about as long as the client takes to come back."""

RESUMED_WITHIN = 5.0
"""Seconds a resumed stream may take to deliver the result; beyond that the result was lost."""


def expected() -> list[str]:
    """The notifications of one call, in order."""
    return ["start"] + [f"step {i}" for i in range(1, BURST + 1)]


def fastmcp_app(event_store: EventStore) -> Any:
    """FastMCP with ``burst``: a notification, close the stream, BURST more notifications, the result."""
    mcp = FastMCP("resumption")

    @mcp.tool
    async def burst(ctx: Context) -> str:
        await ctx.report_progress(0, BURST, "start")
        await ctx.close_sse_stream()
        for i in range(1, BURST + 1):
            await ctx.report_progress(i, BURST, f"step {i}")
            await asyncio.sleep(SPACING)
        return "done"

    return mcp.http_app(event_store=event_store, retry_interval=RECONNECT_MS)


def sdk_app(event_store: EventStore) -> Starlette:
    """The same tool on the plain MCP SDK (a lowlevel Server behind StreamableHTTPSessionManager)."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="burst", input_schema={"type": "object"})])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        await ctx.session.report_progress(0, BURST, "start")
        await ctx.close_sse_stream()
        for i in range(1, BURST + 1):
            await ctx.session.report_progress(i, BURST, f"step {i}")
            await asyncio.sleep(SPACING)
        return types.CallToolResult(content=[types.TextContent(type="text", text="done")])

    return sdk_starlette(Server("resumption", on_list_tools=list_tools, on_call_tool=call_tool), event_store)


APPS = {"fastmcp": fastmcp_app, "sdk": sdk_app}


async def call_then_resume(session: RawSession, request_id: int) -> tuple[list[str], str | None]:
    """Call ``burst``, resume as soon as the server closes the stream: (notifications, result text or None)."""
    notes: list[str] = []
    last_id = ""
    with anyio.fail_after(RESUMED_WITHIN):
        async with session.call(request_id, "burst", {}) as response:
            assert response.status_code == 200, await response.aread()
            async for event in sse_events(response):
                last_id = event.get("id", last_id)
                if event.get("data") and (note := note_of(event["data"])) is not None:
                    notes.append(note[1])
    assert last_id, "the server sent no event id: nothing to resume from"
    with anyio.move_on_after(RESUMED_WITHIN):
        async with session.resume(last_id) as response:
            assert response.status_code == 200, await response.aread()
            async for event in sse_events(response):
                if not event.get("data"):
                    continue
                if (note := note_of(event["data"])) is not None:
                    notes.append(note[1])
                message = json.loads(event["data"])
                if message.get("id") == request_id and "result" in message:
                    return notes, message["result"]["content"][0]["text"]
    return notes, None


async def assert_no_loss(app: Any) -> None:
    """RESUMPTIONS calls of ``burst`` in one session, each resumed at once: nothing lost, nothing twice."""
    lost: list[tuple[int, list[str], str | None]] = []
    async with serving(app) as url, httpx.AsyncClient(timeout=RESUMED_WITHIN) as http:
        session = await RawSession(http, url).open()
        for request_id in range(1, RESUMPTIONS + 1):
            notes, result = await call_then_resume(session, request_id)
            if (notes, result) != (expected(), "done"):
                lost.append((request_id, notes, result))
    assert lost == [], f"{len(lost)} of {RESUMPTIONS} resumptions lost or repeated a message: {lost}"


@pytest.mark.parametrize("server", list(APPS))
async def test_in_memory_resumption_while_sending(server: str) -> None:
    await assert_no_loss(APPS[server](InMemoryEventStore()))


@pytest.mark.parametrize("server", list(APPS))
async def test_store_resumption_while_sending(server: str, store: Any) -> None:
    await assert_no_loss(APPS[server](StoreEventStore(store)))


# -- the mechanics, without a server -------------------------------------------------


async def test_store_replay_in_the_appending_process_needs_no_round_trip(store: Any) -> None:
    counted = FlakyStore(store)
    events = StoreEventStore(counted, cache_events_per_stream=4)
    ids = [await events.store_event("s", notification(i)) for i in range(6)]
    counted.calls.clear()
    assert (await replay(events, ids[2]))[1].ids == ids[3:]
    assert counted.calls == {}
    assert (await replay(events, ids[0]))[1].ids == ids[1:]  # older than the cache: the store
    assert counted.calls == {"get_many": 1}


@pytest.mark.parametrize("make", [InMemoryEventStore, lambda: StoreEventStore(FlakyStore(MemoryStore()))])
async def test_a_message_stored_during_a_replay_waits_for_the_priming_event(make: Any) -> None:
    events = make()
    first = await events.store_event("s", None)
    replaying = asyncio.Event()
    stored: list[str] = []

    async def route_a_message() -> None:
        await replaying.wait()
        stored.append(await events.store_event("s", notification(1)))

    async def slow_client(event: EventMessage) -> None:
        replaying.set()
        await asyncio.sleep(0.05)

    await events.store_event("s", notification(0))
    router = asyncio.create_task(route_a_message())
    assert await events.replay_events_after(first, slow_client) == "s"
    await asyncio.sleep(0.05)
    assert stored == []  # held: the transport has not registered the resumed stream yet
    await events.store_event("s", None)  # the replaying task primes the stream: the handover
    await asyncio.wait_for(router, 1)
    assert len(stored) == 1


async def test_the_hold_is_bounded_without_a_priming_event(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kvstores.events, "HANDOVER_TIMEOUT", 0.2)
    events = InMemoryEventStore()
    first = await events.store_event("s", None)
    await events.store_event("s", notification(0))
    await replay(events, first)
    began = time.monotonic()
    await asyncio.wait_for(asyncio.create_task(events.store_event("s", notification(1))), 2)
    assert 0.1 < time.monotonic() - began < 1
    began = time.monotonic()
    await asyncio.create_task(events.store_event("s", notification(2)))  # the replay is forgotten
    assert time.monotonic() - began < 0.1


@pytest.mark.parametrize("count", [-1, 1.5, True])
def test_invalid_cache_size_rejected(count: Any) -> None:
    with pytest.raises(ValueError):
        StoreEventStore(FlakyStore(None), cache_events_per_stream=count)


# -- following a stream another process appends to (kvstores.events live mode) ----------


def _final(request_id: int) -> types.JSONRPCResponse:
    return types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result={"content": []})


@pytest.fixture
async def stores(store: Any, peer_store: Any) -> AsyncIterator[tuple[Any, Any]]:
    """``store`` and ``peer_store``; the signal channels the event stores opened on them are closed first."""
    yield store, peer_store
    await asyncio.sleep(0.2)  # a live event store's last signal is published from a task of its own
    for opened in (store, peer_store):
        await kvstores.signals.channel(opened).aclose()


async def _follow(follower: StoreEventStore, last_event_id: str, **options: Any) -> tuple[asyncio.Task[Any], Any]:
    from kvstores.conformance.events import Recorder

    sent = Recorder()
    return asyncio.create_task(follower.follow_events_after(last_event_id, sent, **options)), sent


@pytest.mark.parametrize("signals", [True, False], ids=["signals", "polling"])
async def test_a_follower_sends_what_another_process_stores_once_in_order(
    stores: tuple[Any, Any], signals: bool
) -> None:
    store, peer_store = stores
    runner = StoreEventStore(store, live=True)
    follower = StoreEventStore(peer_store if signals else FlakyStore(peer_store))  # a foreign store: no channel
    first = await runner.store_event("7", None)
    ids = [await runner.store_event("7", notification(0))]
    task, sent = await _follow(follower, first)
    for i in range(1, 40):  # more than a read window, some in bursts
        ids.append(await runner.store_event("7", notification(i)))
        if i % 7 == 0:
            await asyncio.sleep(0.05)
    ids.append(await runner.store_event("7", _final(7)))
    assert await asyncio.wait_for(task, 5) is None  # the response ends with the final response
    assert sent.ids == ids
    assert sent.messages[:-1] == [wire(notification(i)) for i in range(40)]


async def test_a_follower_answers_for_a_runner_that_died(
    stores: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, peer_store = stores
    monkeypatch.setattr(kvstores.events, "LEASE_TTL", 0.4)
    monkeypatch.setattr(kvstores.events, "LEASE_REFRESH", 0.1)
    runner, follower = StoreEventStore(store, live=True), StoreEventStore(peer_store)
    first = await runner.store_event("12", None)
    note = await runner.store_event("12", notification(1))
    task, sent = await _follow(follower, first)
    await asyncio.sleep(1.0)
    assert not task.done()  # the runner renews its lease: the call goes on
    assert runner._lease is not None
    runner._lease.cancel()  # the runner dies: its lease is not renewed any more
    died = time.monotonic()
    assert await asyncio.wait_for(task, 5) is None
    assert time.monotonic() - died < 0.4 + 1
    assert sent.ids == [note, None]
    error = sent.events[-1].message
    assert isinstance(error, types.JSONRPCError) and error.id == 12
    assert error.error.code == types.INTERNAL_ERROR and error.error.message == kvstores.events.STOPPED_MESSAGE


async def test_a_follower_never_skips_a_lost_event(stores: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    store, peer_store = stores
    monkeypatch.setattr(kvstores.events, "_HOLE_GRACE", 0.2)
    flaky = FlakyStore(store)
    runner, follower = StoreEventStore(flaky, live=True), StoreEventStore(peer_store)
    first = await runner.store_event("s1", None)
    task, sent = await _follow(follower, first)
    kept = await runner.store_event("s1", notification(1))
    flaky.down = True
    await runner.store_event("s1", notification(2))  # lost: the store failed
    flaky.down = False
    await runner.store_event("s1", notification(3))
    assert await asyncio.wait_for(task, 5) is None
    assert sent.ids == [kept, None]
    error = sent.events[-1].message
    assert isinstance(error, types.JSONRPCError) and error.id == "s1" and "lost" in error.error.message


async def test_a_follower_keeps_to_its_session_and_leaves_the_get_stream_to_the_transport(
    stores: tuple[Any, Any],
) -> None:
    store, peer_store = stores
    runner, follower = StoreEventStore(store, live=True), StoreEventStore(peer_store)
    mine = await runner.store_event("2:ab:5", None)
    await runner.store_event("2:ab:5", notification(1))
    task, sent = await _follow(follower, mine, stream_prefix="2:cd:")
    assert (await asyncio.wait_for(task, 5), sent.events) == (None, [])  # another session's stream
    get = await runner.store_event("2:ab:_GET_stream", None)
    later = await runner.store_event("2:ab:_GET_stream", notification(2))
    task, sent = await _follow(follower, get, stream_prefix="2:ab:")
    assert await asyncio.wait_for(task, 5) == "2:ab:_GET_stream"  # replayed, not followed: it never ends
    assert sent.ids == [later]
