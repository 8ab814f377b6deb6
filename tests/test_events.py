"""The event stores: the conformance suite for both, then limits, costs and faults.

StoreEventStore runs over every backend of the table (the ``store`` fixture).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from mcp import types
from mcp.server.streamable_http import EventStore

from kvstores.backends.memory import MemoryStore
from kvstores.conformance.events import EventStoreConformance, notification, replay, wire
from kvstores.events import (
    DEFAULT_MAX_STREAMS,
    EVENTS_COLLECTION,
    InMemoryEventStore,
    StoreEventStore,
)
from kvstores.events._ring import EventRecord, EventRecordError
from tests.support.events import FlakyStore

pytestmark = pytest.mark.anyio


async def assert_forgotten(events: EventStore, event_id: str) -> None:
    """Replaying after ``event_id`` finds no stream and sends nothing."""
    stream_id, sent = await replay(events, event_id)
    assert (stream_id, sent.events) == (None, [])


class TestInMemoryConformance(EventStoreConformance):
    """InMemoryEventStore passes the suite, limits included."""

    max_events_per_stream = 10
    max_streams = 10
    ttl = 0.5

    @pytest.fixture
    async def event_store(self) -> AsyncIterator[EventStore]:
        yield InMemoryEventStore(max_events_per_stream=10, max_streams=10, ttl=0.5)


class TestStoreEventStoreConformance(EventStoreConformance):
    """StoreEventStore passes the suite over each backend."""

    max_events_per_stream = 10
    max_streams = 10

    @pytest.fixture
    async def event_store(self, store: Any) -> AsyncIterator[EventStore]:
        yield StoreEventStore(store, max_events_per_stream=10, max_streams=10)


# -- InMemoryEventStore --------------------------------------------------------------


async def test_memory_stays_bounded_with_100000_streams() -> None:
    events = InMemoryEventStore()
    first = await events.store_event("s0", None)
    for i in range(100_000):
        last = await events.store_event(f"s{i}", notification(i))
    assert events.stream_count == DEFAULT_MAX_STREAMS
    await assert_forgotten(events, first)
    stream_id, _ = await replay(events, last)
    assert stream_id == "s99999"


async def test_memory_evicts_the_least_recently_used_stream() -> None:
    events = InMemoryEventStore(max_streams=3)
    starts = {name: await events.store_event(name, None) for name in ("a", "b", "c")}
    await events.store_event("a", notification(1))
    await events.store_event("d", None)
    assert events.stream_count == 3
    await assert_forgotten(events, starts["b"])
    for name in ("a", "c"):
        assert (await replay(events, starts[name]))[0] == name


async def test_memory_forgets_idle_streams() -> None:
    events = InMemoryEventStore(ttl=0.1)
    start = await events.store_event("idle", None)
    await asyncio.sleep(0.2)
    await events.store_event("busy", None)
    assert events.stream_count == 1
    await assert_forgotten(events, start)


@pytest.mark.parametrize(
    "options",
    [
        {"max_events_per_stream": 0},
        {"max_events_per_stream": True},
        {"max_events_per_stream": 1.5},
        {"max_streams": 0},
        {"ttl": 0},
        {"ttl": -1},
        {"ttl": math.inf},
        {"ttl": math.nan},
        {"ttl": "60"},
    ],
)
def test_invalid_limits_rejected(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        InMemoryEventStore(**options)
    with pytest.raises(ValueError):
        StoreEventStore(FlakyStore(None), **options)


def test_invalid_timeout_rejected() -> None:
    with pytest.raises(ValueError):
        StoreEventStore(FlakyStore(None), timeout=0)


# -- StoreEventStore: cost and layout ------------------------------------------------


async def test_store_append_and_replay_are_one_round_trip_each(store: Any) -> None:
    counted = FlakyStore(store)
    events = StoreEventStore(counted)
    first = await events.store_event("s", None)
    assert counted.calls == {"put": 1}
    for i in range(60):
        await events.store_event("s", notification(i))
    counted.calls.clear()
    stream_id, sent = await replay(events, first)
    assert (stream_id, len(sent.events)) == ("s", 60)
    assert counted.calls == {"get_many": 1}


async def test_store_over_memory_replays_every_event_from_its_own_memory() -> None:
    """Over ``memory://`` the events are in this process anyway: a replay decodes nothing again."""
    reads = 0

    class CountingMemoryStore(MemoryStore):
        async def get_many(self, keys: Any, *, collection: str | None = None) -> list[dict[str, Any] | None]:
            nonlocal reads
            reads += 1
            return await super().get_many(keys, collection=collection)

    events = StoreEventStore(CountingMemoryStore())
    first = await events.store_event("s", notification(0))
    for i in range(1, 100):
        await events.store_event("s", notification(i))
    stream_id, sent = await replay(events, first)
    assert (stream_id, len(sent.events), reads) == ("s", 99, 0)
    bounded = StoreEventStore(CountingMemoryStore(), cache_events_per_stream=32)
    first = await bounded.store_event("s", notification(0))
    for i in range(1, 100):
        await bounded.store_event("s", notification(i))
    stream_id, sent = await replay(bounded, first)
    assert (stream_id, len(sent.events), reads) == ("s", 99, 1)


async def test_store_entries_keep_their_stored_layout(store: Any) -> None:
    """What is stored is what earlier releases stored and read: the typed records change no key or field."""
    events = StoreEventStore(store)
    priming = await events.store_event("s", None)
    await events.store_event("s", notification(1))
    token = priming.split("-")[0]
    stored = await store.get_many([f"{token}:0", f"{token}:1"], collection=EVENTS_COLLECTION)
    assert stored == [
        {"seq": 0, "stream": "s", "message": None},
        {"seq": 1, "stream": "s", "kind": "JSONRPCNotification", "message": wire(notification(1))},
    ]
    live = StoreEventStore(store, live=True)
    first = await live.append("7", None, request_id="007")
    token = first.split("-")[0]
    entry = await store.get(f"{token}:0", collection=EVENTS_COLLECTION)
    assert entry == {"seq": 0, "stream": "7", "message": None, "id": "007", "replica": live.replica}
    lease = None
    while lease is None:  # the lease's first put runs in the background
        await asyncio.sleep(0.01)
        lease = await store.get(f"replica:{live.replica}", collection=EVENTS_COLLECTION)
    assert lease == {"replica": live.replica}
    await live.store_event("7", types.JSONRPCResponse(jsonrpc="2.0", id="007", result={}))


def test_event_records_round_trip_and_refuse_what_they_cannot_read() -> None:
    record = EventRecord.of(3, "s", notification(3), 12, "r1")
    assert EventRecord.from_json(record.to_json()) == record
    assert record.decode() == notification(3) and not record.final
    end = EventRecord.end(4, "s", 12, "stopped", "r1")
    assert end.final and EventRecord.from_json(end.to_json()) == end
    for corrupt in (
        {**record.to_json(), "v": 2},
        {**record.to_json(), "seq": "3"},
        {**record.to_json(), "kind": "NotAMessage"},
        {"seq": 3, "stream": "s", "kind": "JSONRPCNotification"},
        {"stream": "s", "message": None},
    ):
        with pytest.raises(EventRecordError):
            EventRecord.from_json(corrupt)


async def test_store_keeps_a_bounded_ring_per_stream(store: Any) -> None:
    events = StoreEventStore(store, max_events_per_stream=5)
    ids = [await events.store_event("s", notification(i)) for i in range(23)]
    assert len(await store.keys(collection=EVENTS_COLLECTION)) == 5
    stream_id, sent = await replay(events, ids[-5])
    assert (stream_id, sent.ids) == ("s", ids[-4:])


async def test_store_events_expire(store: Any) -> None:
    events = StoreEventStore(store, ttl=0.3)
    start = await events.store_event("s", None)
    await events.store_event("s", notification(1))
    await asyncio.sleep(0.5)
    await assert_forgotten(events, start)


async def test_store_replays_in_another_process(store: Any, peer_store: Any) -> None:
    writer, reader = StoreEventStore(store), StoreEventStore(peer_store)
    start = await writer.store_event("s", None)
    ids = [await writer.store_event("s", notification(i)) for i in range(3)]
    stream_id, sent = await replay(reader, start)
    assert (stream_id, sent.ids) == ("s", ids)


async def test_store_processes_appending_to_one_stream_lose_no_event(store: Any, peer_store: Any) -> None:
    """Two server processes append to one stream id at once: no event overwrites another.

    There is no read-modify-write to race on: each process numbers its events in memory under
    its own random stream token, so its ring keys are its own. Every event stays replayable
    from any process, and a replay returns exactly the events after its id of that process.
    """
    first, second = StoreEventStore(store), StoreEventStore(peer_store)

    async def append(events: StoreEventStore, who: str) -> list[str]:
        ids = [await events.store_event("shared", None)]
        for i in range(20):
            ids.append(await events.store_event("shared", notification(i, who)))
            await asyncio.sleep(0)
        return ids

    ids_first, ids_second = await asyncio.gather(append(first, "first"), append(second, "second"))
    for ids in (ids_first, ids_second):
        for reader in (first, second):
            stream_id, sent = await replay(reader, ids[0])
            assert (stream_id, sent.ids) == ("shared", ids[1:])


async def test_store_stream_evicted_from_memory_goes_on_under_a_new_token(store: Any) -> None:
    events = StoreEventStore(store, max_streams=1)
    old = [await events.store_event("a", notification(i)) for i in range(3)]
    await events.store_event("b", None)
    new = [await events.store_event("a", notification(i)) for i in range(3, 5)]
    assert old[0].split("-")[0] != new[0].split("-")[0]
    assert (await replay(events, old[0]))[1].ids == old[1:]
    assert (await replay(events, new[0]))[1].ids == new[1:]


# -- StoreEventStore: faults ---------------------------------------------------------


async def test_store_event_never_raises_when_the_backend_is_down(store: Any, caplog: pytest.LogCaptureFixture) -> None:
    flaky = FlakyStore(store)
    events = StoreEventStore(flaky)
    start = await events.store_event("s", None)
    flaky.down = True
    with caplog.at_level(logging.DEBUG, logger="kvstores.events"):
        lost = [await events.store_event("s", notification(i)) for i in range(3)]
        await assert_forgotten(events, start)
    warnings = [r for r in caplog.records if r.name == "kvstores.events" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "StoreConnectionError" in warnings[0].getMessage()
    assert len(set(lost)) == 3
    flaky.down = False
    after = [await events.store_event("s", notification(i)) for i in range(3, 5)]
    assert (await replay(events, start))[1].ids == []  # the outage left a gap: never skip over it
    assert (await replay(events, after[0]))[1].ids == after[1:]


async def test_store_event_gives_up_on_a_hung_backend(store: Any) -> None:
    flaky = FlakyStore(store)
    events = StoreEventStore(flaky, timeout=0.1)
    start = await events.store_event("s", None)
    flaky.hang = True
    began = time.monotonic()
    await events.store_event("s", notification(1))
    await assert_forgotten(events, start)
    assert time.monotonic() - began < 2


async def test_store_replay_of_corrupt_data_returns_none(store: Any, caplog: pytest.LogCaptureFixture) -> None:
    events = StoreEventStore(store, cache_events_per_stream=0)  # replay from the store, where the corruption is
    start = await events.store_event("s", None)
    await events.store_event("s", notification(1))
    token = start.split("-")[0]
    corrupt = {"seq": 1, "stream": "s", "kind": "JSONRPCNotification", "message": '{"not": "a message"}'}
    await store.put(f"{token}:1", corrupt, collection=EVENTS_COLLECTION)
    with caplog.at_level(logging.WARNING, logger="kvstores.events"):
        await assert_forgotten(events, start)
    assert any(r.name == "kvstores.events" for r in caplog.records)


async def test_store_event_survives_a_closed_store(store: Any) -> None:
    events = StoreEventStore(store)
    await store.aclose()
    event_id = await events.store_event("s", notification(1))
    await assert_forgotten(events, event_id)
