"""EventStoreConformance: the MCP event-store contract as a reusable pytest class.

Subclass it and provide an ``event_store`` fixture that yields a fresh
:class:`mcp.server.streamable_http.EventStore`::

    class TestMyEventStore(EventStoreConformance):
        max_events_per_stream = 5

        @pytest.fixture
        async def event_store(self):
            yield MyEventStore(max_events_per_stream=5)

It checks what the Streamable HTTP transport relies on to resume a dropped stream: replay
sends, in order, the events of the id's own stream stored after it, skips priming events
(message None) and returns the stream id; unknown ids send nothing and return None; ids
are unguessable and never reach another stream. Class attributes describe the store's
limits; a limit left at None is reported as skipped. Test names start with their group
(``test_replay_...``, ``test_ids_...``, ``test_isolation_...``, ``test_limits_...``).
Outside the ``limits`` group no test stores more than 10 events per stream or uses more than
10 streams at once, so a store with limits at least that large passes the other groups.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from typing import Any, ClassVar

import pytest

from kvstores._optional import missing_extra
from kvstores.conformance._base import Conformance, abstract_fixture

try:
    from mcp.server.streamable_http import EventMessage, EventStore
    from mcp.types import ErrorData, JSONRPCError, JSONRPCMessage, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("mcp", "mcp") from exc

__all__ = ["EventStoreConformance", "notification"]


def notification(index: int, text: str = "") -> JSONRPCNotification:
    """A progress notification numbered ``index``: a message that is easy to recognise in a replay."""
    params = {"progressToken": "t", "progress": index, "message": text or f"step {index}"}
    return JSONRPCNotification(jsonrpc="2.0", method="notifications/progress", params=params)


def wire(message: JSONRPCMessage) -> str:
    """The message as the transport puts it on the wire."""
    return message.model_dump_json(by_alias=True, exclude_unset=True)


class Recorder:
    """A send_callback that records what a replay sends."""

    def __init__(self) -> None:
        self.events: list[EventMessage] = []

    async def __call__(self, event: EventMessage) -> None:
        self.events.append(event)

    @property
    def ids(self) -> list[str | None]:
        """The event ids sent so far."""
        return [event.event_id for event in self.events]

    @property
    def messages(self) -> list[str]:
        """The messages sent so far, in wire form."""
        return [wire(event.message) for event in self.events]


async def replay(event_store: EventStore, last_event_id: str) -> tuple[str | None, Recorder]:
    """Replay after ``last_event_id``: the returned stream id and what was sent."""
    recorder = Recorder()
    return await event_store.replay_events_after(last_event_id, recorder), recorder


class EventStoreConformance(Conformance):
    """The kvstores event-store contract (DESIGN §4); subclass it with an ``event_store`` fixture."""

    subject: ClassVar[str] = "event_store"

    max_events_per_stream: ClassVar[int | None] = None
    """Events the fixture's store keeps per stream, at least 10 (None: trimming is not checked)."""
    max_streams: ClassVar[int | None] = None
    """Streams the fixture's store keeps at least, at least 10 (None: many-stream retention is not checked)."""
    ttl: ClassVar[float | None] = None
    """Seconds after which the fixture's store forgets an event (None: expiry is not checked)."""

    event_store = abstract_fixture("The event store under test, holding no events: override this fixture.")

    def _limit(self, name: str) -> Any:
        value = getattr(self, name)
        if value is None:
            pytest.skip(f"{type(self).__name__}.{name} is None: the store's limit is not known, so not checked")
        return value

    # -- replay ----------------------------------------------------------------------

    async def test_replay_sends_later_events_in_order(self, event_store: EventStore) -> None:
        priming = await event_store.store_event("s", None)
        ids = [await event_store.store_event("s", notification(i)) for i in range(5)]
        stream_id, sent = await replay(event_store, ids[1])
        assert stream_id == "s"
        assert sent.ids == ids[2:]
        assert sent.messages == [wire(notification(i)) for i in range(2, 5)]
        stream_id, sent = await replay(event_store, priming)
        assert (stream_id, sent.ids) == ("s", ids)

    async def test_replay_from_every_event(self, event_store: EventStore) -> None:
        messages: list[JSONRPCMessage | None] = [None, notification(0), notification(1), None, notification(2)]
        ids = [await event_store.store_event("s", message) for message in messages]
        for position, event_id in enumerate(ids):
            later = [(i, wire(m)) for i, m in zip(ids[position + 1 :], messages[position + 1 :]) if m is not None]
            stream_id, sent = await replay(event_store, event_id)
            assert stream_id == "s"
            assert list(zip(sent.ids, sent.messages)) == later

    async def test_replay_skips_priming_events(self, event_store: EventStore) -> None:
        first = await event_store.store_event("s", None)
        await event_store.store_event("s", None)
        last = await event_store.store_event("s", notification(1))
        await event_store.store_event("s", None)
        stream_id, sent = await replay(event_store, first)
        assert stream_id == "s"
        assert sent.ids == [last]
        assert all(event.message is not None for event in sent.events)

    async def test_replay_after_latest_sends_nothing(self, event_store: EventStore) -> None:
        await event_store.store_event("s", notification(0))
        latest = await event_store.store_event("s", notification(1))
        stream_id, sent = await replay(event_store, latest)
        assert (stream_id, sent.events) == ("s", [])

    async def test_replay_round_trips_every_message_kind(self, event_store: EventStore) -> None:
        messages: list[JSONRPCMessage] = [
            JSONRPCRequest(jsonrpc="2.0", id="req-1", method="sampling/createMessage", params={"x": [1, 2.5]}),
            JSONRPCRequest(jsonrpc="2.0", id=7, method="ping"),
            JSONRPCNotification(jsonrpc="2.0", method="notifications/message", params={"data": {"é": "\U0001f600\n"}}),
            JSONRPCNotification(jsonrpc="2.0", method="notifications/tools/list_changed"),
            JSONRPCResponse(jsonrpc="2.0", id=3, result={"content": [{"type": "text", "text": "ok"}], "n": 2**70}),
            JSONRPCError(jsonrpc="2.0", id="e", error=ErrorData(code=-32603, message="boom", data={"why": None})),
            JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=-32700, message="parse error")),
        ]
        priming = await event_store.store_event("s", None)
        for message in messages:
            await event_store.store_event("s", message)
        _, sent = await replay(event_store, priming)
        assert sent.messages == [wire(message) for message in messages]
        assert [type(event.message) for event in sent.events] == [type(message) for message in messages]

    async def test_replay_leaves_the_stream_going(self, event_store: EventStore) -> None:
        first = await event_store.store_event("s", notification(0))
        await replay(event_store, first)
        resumed = await event_store.store_event("s", None)
        more = [await event_store.store_event("s", notification(i)) for i in (1, 2)]
        _, sent = await replay(event_store, first)
        assert sent.messages == [wire(notification(i)) for i in (1, 2)]
        _, sent = await replay(event_store, resumed)
        assert sent.ids == more

    async def test_replay_tolerates_appends_while_sending(self, event_store: EventStore) -> None:
        first = await event_store.store_event("s", None)
        ids = [await event_store.store_event("s", notification(i)) for i in range(4)]
        appended: list[str] = []

        async def slow_client(event: EventMessage) -> None:
            appended.append(await event_store.store_event("s", notification(100 + len(appended))))
            await asyncio.sleep(0)

        assert await event_store.replay_events_after(first, slow_client) == "s"
        _, sent = await replay(event_store, first)
        assert sent.ids == ids + appended

    # -- ids -------------------------------------------------------------------------

    async def test_ids_are_distinct_sse_safe_strings(self, event_store: EventStore) -> None:
        ids = [await event_store.store_event(f"s{i % 3}", notification(i) if i % 4 else None) for i in range(60)]
        assert all(isinstance(event_id, str) and event_id for event_id in ids)
        assert len(set(ids)) == len(ids)
        assert not any(set(event_id) & {"\n", "\r", "\x00"} for event_id in ids)

    async def test_ids_look_unguessable(self, event_store: EventStore) -> None:
        # 122 random bits need at least 21 base64 or 31 hex characters; two random ids differ almost everywhere
        ids = [await event_store.store_event(f"s{i}", None) for i in range(20)]
        assert min(len(event_id) for event_id in ids) >= 21
        for a, b in itertools.combinations(ids, 2):
            assert sum(x != y for x, y in zip(a, b)) >= 16, (a, b)

    async def test_ids_near_mine_never_reach_another_stream(self, event_store: EventStore) -> None:
        victim = [await event_store.store_event("victim", notification(i, "secret")) for i in range(3)]
        mine = [await event_store.store_event("mine", notification(i, "mine")) for i in range(3)]
        own = mine[0]
        guesses = {own[:i] + c + own[i + 1 :] for i in range(len(own)) for c in "0f-"}
        guesses |= {own + "0", own[:-1], victim[0][:8] + own[8:]}
        for guess in sorted(guesses - set(mine) - set(victim)):
            stream_id, sent = await replay(event_store, guess)
            assert stream_id in (None, "mine"), guess
            assert not any("secret" in text for text in sent.messages), guess

    async def test_ids_unknown_send_nothing(self, event_store: EventStore) -> None:
        real = await event_store.store_event("s", None)
        await event_store.store_event("s", notification(1))
        unknown = ["", "0", "-1", "s-0", "nonsense", str(uuid.uuid4()), "x" * 10_000, real + "\n", real + "0" * 30]
        for event_id in unknown:
            stream_id, sent = await replay(event_store, event_id)
            assert (stream_id, sent.events) == (None, []), event_id

    # -- isolation -------------------------------------------------------------------

    async def test_isolation_interleaved_streams(self, event_store: EventStore) -> None:
        starts = {name: await event_store.store_event(name, None) for name in ("a", "b", "_GET_stream")}
        expected: dict[str, list[str]] = {name: [] for name in starts}
        for i in range(12):
            name = list(starts)[i % 3]
            expected[name].append(await event_store.store_event(name, notification(i, name)))
        for name, start in starts.items():
            stream_id, sent = await replay(event_store, start)
            assert (stream_id, sent.ids) == (name, expected[name])

    async def test_isolation_concurrent_streams(self, event_store: EventStore) -> None:
        async def run(name: str) -> list[str]:
            ids = []
            for i in range(8):
                ids.append(await event_store.store_event(name, None if i == 0 else notification(i, name)))
                await asyncio.sleep(0)
            return ids

        names = [f"stream-{n}" for n in range(10)]
        results = await asyncio.gather(*(run(name) for name in names))
        for name, ids in zip(names, results):
            stream_id, sent = await replay(event_store, ids[0])
            assert (stream_id, sent.ids) == (name, ids[1:])
            assert sent.messages == [wire(notification(i, name)) for i in range(1, 8)]

    # -- limits ----------------------------------------------------------------------

    async def test_limits_oldest_events_trimmed(self, event_store: EventStore) -> None:
        keep = self._limit("max_events_per_stream")
        ids = [await event_store.store_event("s", notification(i)) for i in range(keep + 3)]
        for trimmed in ids[:3]:
            stream_id, sent = await replay(event_store, trimmed)
            assert (stream_id, sent.events) == (None, []), trimmed
        stream_id, sent = await replay(event_store, ids[3])
        assert (stream_id, sent.ids) == ("s", ids[4:])

    async def test_limits_recent_streams_kept(self, event_store: EventStore) -> None:
        count = self._limit("max_streams")
        starts, ids = [], []
        for i in range(count + 5):
            starts.append(await event_store.store_event(f"s{i}", None))
            ids.append(await event_store.store_event(f"s{i}", notification(i)))
        for i in range(5, count + 5):
            stream_id, sent = await replay(event_store, starts[i])
            assert (stream_id, sent.ids) == (f"s{i}", [ids[i]])

    async def test_limits_events_expire(self, event_store: EventStore) -> None:
        ttl = self._limit("ttl")
        first = await event_store.store_event("s", None)
        await event_store.store_event("s", notification(1))
        await asyncio.sleep(ttl + 0.2)
        stream_id, sent = await replay(event_store, first)
        assert (stream_id, sent.events) == (None, [])
