"""Resuming dropped Streamable HTTP streams through real servers: FastMCP and the plain MCP SDK on uvicorn.

Every scenario runs for InMemoryEventStore and for StoreEventStore over each backend of the table.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import anyio
import httpx
import pytest
from fastmcp import Client
from mcp.server.streamable_http import EventStore

from kvstores.events import InMemoryEventStore, StoreEventStore
from tests.support.events import (
    DROP_AFTER,
    RECONNECT_MS,
    FlakyStore,
    RawSession,
    SpyEventStore,
    expected_notes,
    fastmcp_server,
    note_of,
    run_long_task,
    sdk_app,
    serving,
    sse_events,
)

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]


async def drain(stream: Any, *, until_response: int | None = None) -> list[dict[str, str]]:
    """The SSE events of a streamed request, until the server closes it or the response to ``until_response``."""
    events = []
    with anyio.fail_after(10):
        async with stream as response:
            assert response.status_code == 200, await response.aread()
            async for event in sse_events(response):
                events.append(event)
                data = json.loads(event["data"]) if event.get("data") else {}
                if until_response is not None and data.get("id") == until_response and "result" in data:
                    break
    return events


def notes_in(events: list[dict[str, str]]) -> list[tuple[str, str]]:
    """The progress and log notifications among SSE events, in order."""
    return [note for event in events if event.get("data") and (note := note_of(event["data"])) is not None]


def assert_resumed_once(spy: SpyEventStore) -> None:
    """One replay found its stream and sent what the client missed (the post-drop step at least)."""
    found = [sent for _, stream_id, sent in spy.replays if stream_id is not None]
    assert len(found) == 1 and found[0] >= 2, spy.replays


def assert_dropped_midway(before: list[dict[str, str]]) -> None:
    """The first response stream ended early: some notifications arrived, none after the drop."""
    assert 0 < len(notes_in(before)) <= 2 * DROP_AFTER
    assert not any('"result"' in event.get("data", "") for event in before)


class ResumeScenarios:
    """Drop-and-resume scenarios; a subclass provides ``event_store``."""

    @pytest.fixture
    def event_store(self) -> EventStore:
        raise NotImplementedError

    async def test_fastmcp_client_resumes_after_close_sse_stream(self, event_store: EventStore) -> None:
        spy = SpyEventStore(event_store)
        app = fastmcp_server().http_app(event_store=spy, retry_interval=RECONNECT_MS)
        async with serving(app) as url:
            notes, result, echo = await run_long_task(url)
        assert notes == expected_notes()
        assert (result, echo) == ("done", "still here")
        assert_resumed_once(spy)

    async def test_raw_get_with_last_event_id_replays_missed_events(self, event_store: EventStore) -> None:
        app = fastmcp_server().http_app(event_store=event_store, retry_interval=RECONNECT_MS)
        async with serving(app) as url, httpx.AsyncClient(timeout=10) as http:
            session = await RawSession(http, url).open()
            before = await drain(session.call(1, "long_task", {}))
            await asyncio.sleep(RECONNECT_MS / 1000)
            after = await drain(session.resume(before[-1]["id"]), until_response=1)
        assert before[0]["data"] == "" and before[0]["retry"] == str(RECONNECT_MS)  # the priming event
        assert_dropped_midway(before)
        assert notes_in(before) + notes_in(after) == expected_notes()
        assert json.loads(after[-1]["data"])["result"]["content"][0]["text"] == "done"
        ids = [event["id"] for event in before + after if event.get("data")]
        assert len(set(ids)) == len(ids)

    async def test_another_session_presenting_the_id_receives_nothing(self, event_store: EventStore) -> None:
        app = fastmcp_server().http_app(event_store=event_store, retry_interval=RECONNECT_MS)
        async with serving(app) as url, httpx.AsyncClient(timeout=10) as http:
            owner = await RawSession(http, url).open()
            before = await drain(owner.call(1, "long_task", {}))
            await asyncio.sleep(RECONNECT_MS / 1000)
            thief = await RawSession(http, url).open()
            stolen = await drain(thief.resume(before[-1]["id"]))
            resumed = await drain(owner.resume(before[-1]["id"]), until_response=1)
        assert [event for event in stolen if event.get("data")] == []
        assert notes_in(before) + notes_in(resumed) == expected_notes()

    async def test_plain_sdk_session_manager_resumes(self, event_store: EventStore) -> None:
        spy = SpyEventStore(event_store)
        async with serving(sdk_app(spy)) as url:
            notes, result, echo = await run_long_task(url)
        assert notes == expected_notes()
        assert (result, echo) == ("done", "still here")
        assert_resumed_once(spy)

    async def test_plain_sdk_raw_resume(self, event_store: EventStore) -> None:
        async with serving(sdk_app(event_store)) as url, httpx.AsyncClient(timeout=10) as http:
            session = await RawSession(http, url).open()
            before = await drain(session.call(1, "long_task", {}))
            await asyncio.sleep(RECONNECT_MS / 1000)
            after = await drain(session.resume(before[-1]["id"]), until_response=1)
        assert_dropped_midway(before)
        assert notes_in(before) + notes_in(after) == expected_notes()


class TestInMemoryEventStore(ResumeScenarios):
    """The scenarios with events in process memory."""

    @pytest.fixture
    def event_store(self) -> EventStore:
        return InMemoryEventStore()


class TestStoreEventStore(ResumeScenarios):
    """The scenarios with events in each backend of the table, plus backend outages."""

    @pytest.fixture
    def event_store(self, store: Any) -> EventStore:
        return StoreEventStore(store)

    async def test_backend_outage_keeps_fastmcp_answering(self, store: Any, caplog: pytest.LogCaptureFixture) -> None:
        flaky = FlakyStore(store)
        app = fastmcp_server().http_app(event_store=StoreEventStore(flaky), retry_interval=RECONNECT_MS)
        async with serving(app) as url, Client(url, mode="legacy") as client:
            assert (await client.call_tool("echo", {"text": "up"})).data == "up"
            flaky.down = True
            with caplog.at_level(logging.WARNING, logger="kvstores.events"):
                answers = [(await client.call_tool("echo", {"text": f"down {i}"})).data for i in range(3)]
            flaky.down = False
            assert (await client.call_tool("echo", {"text": "back"})).data == "back"
        assert answers == [f"down {i}" for i in range(3)]
        assert [r.levelno for r in caplog.records if r.name == "kvstores.events"] == [logging.WARNING]

    async def test_backend_closed_keeps_sdk_answering(self, store: Any, caplog: pytest.LogCaptureFixture) -> None:
        async with serving(sdk_app(StoreEventStore(store))) as url, Client(url, mode="legacy") as client:
            assert (await client.call_tool("echo", {"text": "up"})).content[0].text == "up"
            await store.aclose()
            with caplog.at_level(logging.WARNING, logger="kvstores.events"):
                answers = [(await client.call_tool("echo", {"text": f"gone {i}"})).content[0].text for i in range(3)]
        assert answers == [f"gone {i}" for i in range(3)]
        assert any(r.name == "kvstores.events" and r.levelno == logging.WARNING for r in caplog.records)
