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
import math
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastmcp import Context, FastMCP
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http import EventMessage, EventStore
from starlette.applications import Starlette

import kvstores.events._follow
import kvstores.events._handover
import kvstores.events._liveness
import kvstores.events._ring
import kvstores.signals
from kvstores import MemoryStore, open_store
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

SHORT_LEASE = 0.6
"""The runners' LEASE_TTL in the lease tests (LEASE_REFRESH 0.1 s): room for two round trips on a loaded machine."""


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
    monkeypatch.setattr(kvstores.events._handover, "HANDOVER_TIMEOUT", 0.2)
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
    monkeypatch.setattr(kvstores.events._liveness, "LEASE_TTL", SHORT_LEASE)
    monkeypatch.setattr(kvstores.events._liveness, "LEASE_REFRESH", 0.1)
    runner, follower = StoreEventStore(store, live=True), StoreEventStore(peer_store)
    first = await runner.store_event("12", None)
    note = await runner.store_event("12", notification(1))
    task, sent = await _follow(follower, first)
    await asyncio.sleep(1.0)
    assert not task.done()  # the runner renews its lease: the call goes on
    assert runner._liveness.renewing is not None
    runner._liveness.renewing.cancel()  # the runner dies: its lease is not renewed any more
    died = time.monotonic()
    assert await asyncio.wait_for(task, 5) is None
    assert time.monotonic() - died < SHORT_LEASE + 1.5  # the lease, the grace, a poll and the terminal record's write
    assert sent.ids == [note, _sibling(first, 2)]  # the error is the stream's terminal record: it has an id
    error = sent.events[-1].message
    assert isinstance(error, types.JSONRPCError) and error.id == 12
    assert error.error.code == types.INTERNAL_ERROR and error.error.message == kvstores.events.STOPPED_MESSAGE


async def test_a_follower_never_skips_a_lost_event(stores: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    store, peer_store = stores
    monkeypatch.setattr(kvstores.events._follow, "_HOLE_GRACE", 0.2)
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
    assert sent.ids == [kept, _sibling(first, 2)]
    error = sent.events[-1].message
    assert isinstance(error, types.JSONRPCError) and error.id == "s1" and "lost" in error.error.message


def _sibling(event_id: str, seq: int) -> str:
    """The id of event ``seq`` of ``event_id``'s stream."""
    return f"{event_id.rpartition('-')[0]}-{seq}"


async def _freeze(runner: StoreEventStore) -> None:
    """The runner's process stops: its lease is renewed no more (a cancel that lands inside a put may be lost)."""
    while (renewing := runner._liveness.renewing) is not None and not renewing.done():
        renewing.cancel()
        await asyncio.sleep(0.01)


@pytest.fixture
def short_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kvstores.events._liveness, "LEASE_TTL", SHORT_LEASE)
    monkeypatch.setattr(kvstores.events._liveness, "LEASE_REFRESH", 0.1)


@pytest.mark.usefixtures("short_lease")
async def test_a_thawed_runner_never_reaches_a_stream_answered_for_it(stores: tuple[Any, Any]) -> None:
    """One final answer per request: once a follower answered for a frozen runner, the runner's later events
    and result are refused, by the runner and by every reader, and the runner cancels the request."""
    store, peer_store = stores
    runner, follower = StoreEventStore(store, live=True), StoreEventStore(peer_store)
    cancelled: list[str] = []
    gave_up = asyncio.Event()

    async def cancel() -> None:
        cancelled.append("9")
        gave_up.set()

    first = await runner.append("9", None, request_id="9", on_fence=cancel)
    note = await runner.store_event("9", notification(1))
    task, sent = await _follow(follower, first)
    await _freeze(runner)
    assert await asyncio.wait_for(task, 5) is None
    end = _sibling(first, 2)
    assert sent.ids == [note, end]
    assert isinstance(sent.events[-1].message, types.JSONRPCError) and sent.events[-1].message.id == "9"
    # Thawed: the runner goes on, and learns at its next event that its lease lapsed.
    await runner.store_event("9", notification(2))
    await runner.store_event("9", _final(9))
    await asyncio.wait_for(gave_up.wait(), 5)
    assert cancelled == ["9"]
    for reader in (follower, runner, StoreEventStore(peer_store)):
        for position, anchor in enumerate((first, note, end)):
            task, resumed = await _follow(reader, anchor)
            await asyncio.wait_for(task, 5)
            assert resumed.ids == [note, end][position:], (reader.replica, position)
            assert (await replay(reader, anchor))[1].ids == [note, end][position:]


@pytest.mark.usefixtures("short_lease")
async def test_events_written_before_the_runner_learns_are_never_delivered(
    stores: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thaw race: the runner stores events before it notices its lease lapsed; readers refuse them,
    and the runner learns of the answer at its next lease renewal and cancels the request."""
    store, peer_store = stores
    runner, follower = StoreEventStore(store, live=True), StoreEventStore(peer_store)
    cancelled: list[int] = []
    gave_up = asyncio.Event()

    async def cancel() -> None:
        cancelled.append(1)
        gave_up.set()

    first = await runner.append("4", None, request_id=4, on_fence=cancel)
    note = await runner.store_event("4", notification(1))
    task, _ = await _follow(follower, first)
    await _freeze(runner)
    assert await asyncio.wait_for(task, 5) is None
    with monkeypatch.context() as stalled:  # it has not noticed yet, nor renewed its lease: these are written
        stalled.setattr(runner._liveness, "hold", lambda: None)
        runner._liveness.lease.until = math.inf
        late = [await runner.store_event("4", notification(2)), await runner.store_event("4", notification(3))]
    assert (await replay(StoreEventStore(peer_store), first))[1].ids == [note, _sibling(first, 2)]
    assert late[0] == _sibling(first, 2)  # the id of the record that ends the stream: nothing follows it
    assert (await replay(StoreEventStore(peer_store), late[0]))[1].ids == []
    assert (await replay(StoreEventStore(peer_store), late[1]))[1].ids == [late[0]]  # an id the end voided
    assert cancelled == []
    runner._liveness.hold()  # its next renewal reads the stream's end
    await asyncio.wait_for(gave_up.wait(), 5)
    assert cancelled == [1]
    await runner.store_event("4", _final(4))  # the cancelled request's answer: refused
    assert (await replay(runner, note))[1].ids == [_sibling(first, 2)]
    assert (await replay(StoreEventStore(peer_store), first))[1].ids == [note, _sibling(first, 2)]


@pytest.mark.usefixtures("short_lease")
async def test_a_resumption_from_the_end_of_a_stream_ends_when_the_runner_stored_an_event_there(
    stores: tuple[Any, Any],
) -> None:
    """The runner was frozen inside the put of the event its answered-for request's end took the place of:
    thawed, the put lands beside the end record. Resuming from the end's id sends nothing and ends (None):
    a stream id would make the transport wait for live events that never come, and the response never end."""
    store, peer_store = stores
    runner, follower = StoreEventStore(store, live=True), StoreEventStore(peer_store)
    gave_up = asyncio.Event()

    async def cancel() -> None:
        gave_up.set()

    first = await runner.append("5", None, request_id=5, on_fence=cancel)
    note = await runner.store_event("5", notification(1))
    task, sent = await _follow(follower, first)
    await _freeze(runner)
    assert await asyncio.wait_for(task, 5) is None
    end = _sibling(first, 2)
    assert sent.ids == [note, end]
    runner._liveness.lease.until = math.inf  # the put in flight at the freeze: it lands once thawed
    assert await runner.store_event("5", notification(2)) == end
    await asyncio.wait_for(gave_up.wait(), 5)  # its next lease renewal reads the stream's end
    for reader in (follower, runner, StoreEventStore(peer_store)):
        for anchor, after in ((first, [note, end]), (note, [end]), (end, [])):
            task, resumed = await _follow(reader, anchor)
            assert await asyncio.wait_for(task, 5) is None, (reader.replica, anchor)
            assert resumed.ids == after, (reader.replica, anchor)


@pytest.mark.usefixtures("short_lease")
async def test_the_answer_comes_in_time_while_a_frozen_process_holds_the_sqlite_write_lock(
    tmp_path: Path,
) -> None:
    """The follower cannot record the request's end: it says the outcome is open (never a silent success),
    within the bound; the thawed runner records the end itself before anything else it stores counts."""
    url = f"sqlite:///{tmp_path / 'events.db'}"
    async with open_store(url) as store, open_store(url) as peer_store:
        runner, follower = StoreEventStore(store, live=True), StoreEventStore(peer_store)
        first = await runner.append("3", None, request_id="003")
        note = await runner.store_event("3", notification(1))
        await follower._signals.listen()  # a replica listens from its first follow on, long before this one
        assert await peer_store.get("opened", collection="elsewhere") is None  # and has its store open
        await _freeze(runner)
        frozen = time.monotonic()
        lock = sqlite3.connect(tmp_path / "events.db", isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")  # the frozen process's write transaction
        try:
            task, sent = await _follow(follower, first)  # the follow starts (and announces itself) under the lock
            assert await asyncio.wait_for(task, 5) is None
            assert time.monotonic() - frozen < SHORT_LEASE + 1 + kvstores.events._follow._FENCE_TIMEOUT
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        error = sent.events[-1].message
        assert sent.ids == [note, None] and isinstance(error, types.JSONRPCError)
        assert (error.id, error.error.message) == ("003", kvstores.events.UNSETTLED_MESSAGE)
        await runner.store_event("3", _final(3))  # thawed: its lease lapsed, it records the end first
        await asyncio.sleep(0.3)
        resumed = (await replay(StoreEventStore(peer_store), first))[1]
        assert resumed.ids == [note, _sibling(first, 2)]
        assert resumed.messages[-1] == wire(kvstores.events._ring.error("003", kvstores.events.STOPPED_MESSAGE))
        await kvstores.signals.channel(store).aclose()
        await kvstores.signals.channel(peer_store).aclose()


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


async def test_a_runner_signals_only_the_streams_a_follower_follows(stores: tuple[Any, Any]) -> None:
    store, peer_store = stores
    heard: asyncio.Queue[str] = asyncio.Queue()
    unlisten = await kvstores.signals.channel(peer_store).listen(kvstores.events.SIGNALS, heard.put_nowait)
    try:
        runner, follower = StoreEventStore(store, live=True), StoreEventStore(peer_store)
        alone = await runner.store_event("1", None)
        await runner.store_event("1", notification(1))
        followed = await runner.store_event("2", None)
        task, sent = await _follow(follower, followed)
        signalled = await asyncio.wait_for(heard.get(), 5)  # the runner heard the follow: it signals that stream
        assert signalled == followed.rpartition("-")[0]
        ids = [await runner.store_event("2", notification(2)), await runner.store_event("2", _final(2))]
        assert await asyncio.wait_for(task, 5) is None
        assert sent.ids == ids
        await runner.store_event("1", _final(1))
        await asyncio.sleep(0.3)  # time for a signal of stream 1 to come, were one published
        tokens = {signalled} | {heard.get_nowait() for _ in range(heard.qsize())}
        assert alone.rpartition("-")[0] not in tokens, "a stream nobody follows costs no signal"
    finally:
        unlisten()
