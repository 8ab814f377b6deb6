"""What both event stores share: event ids, each stream's cursor and recent events, and the live handover.

A replay sends the events stored before it began; a message another task stores on that
stream meanwhile waits in ``store_event`` until the replaying task has stored its priming
event (then a few event-loop turns more, for the transport to register the stream), at most
:data:`HANDOVER_TIMEOUT` seconds. :mod:`kvstores.events` describes the guarantee.
"""

from __future__ import annotations

import enum
import itertools
import math
import re
import secrets
import time
from collections import OrderedDict, deque

import anyio
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, StreamId
from mcp.types import JSONRPCMessage

DEFAULT_MAX_EVENTS_PER_STREAM = 100
"""Events kept per stream; storing one more drops the oldest."""

DEFAULT_MAX_STREAMS = 10_000
"""Streams tracked at once; a new stream beyond it evicts the least recently used."""

DEFAULT_TTL = 3600.0
"""Seconds an event stays replayable after it was stored."""

HANDOVER_TIMEOUT = 1.0
"""Seconds at most that ``store_event`` holds a message back while a replay of its stream hands over."""

_HANDOVER_TURNS = 8
"""Event-loop turns a held message waits after the priming event: the transport needs one or two to register."""

_EVENT_ID = re.compile(r"([0-9a-f]{32})-(0|[1-9][0-9]{0,17})\Z")


def make_event_id(token: str, seq: int) -> EventId:
    """The opaque id of event ``seq`` of the stream whose token is ``token``."""
    return f"{token}-{seq}"


def parse_event_id(event_id: object) -> tuple[str, int] | None:
    """``(token, seq)`` of an id this module minted, or None for anything else."""
    match = _EVENT_ID.match(event_id) if isinstance(event_id, str) else None
    return None if match is None else (match[1], int(match[2]))


def _positive_int(name: str, value: int, *, minimum: int = 1) -> int:
    """``value``, checked to be an int (not a bool) of at least ``minimum``, for the argument ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def positive_seconds(name: str, value: float) -> float:
    """``value`` as a float, checked to be a finite number of seconds > 0, for the argument ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


class Slot(enum.Enum):
    """A cached event that cannot be replayed (yet): a replay stops there rather than skip it."""

    WRITING = "writing"  # its put is in flight
    LOST = "lost"  # the store failed to keep it


CachedEvent = tuple[int, float, JSONRPCMessage | Slot | None]
"""(sequence number, monotonic time stored, message: None for a priming event)."""


class Replay:
    """A replay in progress: the task running it and the last event it sends; set ``handed_over`` when done."""

    __slots__ = ("deadline", "handed_over", "last", "task")

    def __init__(self, last: int) -> None:
        self.task = anyio.get_current_task().id
        self.last = last
        self.deadline = time.monotonic() + HANDOVER_TIMEOUT
        self.handed_over = anyio.Event()


class Stream:
    """One stream's cursor: its random token, next sequence number, recent events and the replay under way."""

    __slots__ = ("events", "in_flight", "next_seq", "replay", "request_id", "stream_id", "token", "touched", "written")

    def __init__(self, stream_id: StreamId, max_events: int) -> None:
        self.stream_id = stream_id
        self.token = secrets.token_hex(16)
        self.next_seq = 0
        self.touched = 0.0
        self.events: deque[CachedEvent] = deque(maxlen=max_events)
        self.replay: Replay | None = None
        self.in_flight: set[int] = set()  # messages whose put has not returned yet
        self.written: anyio.Event | None = None  # set (and dropped) when one of them returns
        self.request_id: str | int | None = None  # the request's JSON-RPC id as sent, when the transport told it

    def begin_replay(self) -> Replay:
        """Record a replay of the events stored so far; later messages of other tasks wait for its handover."""
        self.replay = replay = Replay(self.next_seq - 1)
        return replay

    def abandon(self, replay: Replay) -> None:
        """The replay failed or found nothing: no stream will be registered, release what waits for it."""
        replay.handed_over.set()
        if self.replay is replay:
            self.replay = None

    def primed(self) -> None:
        """A priming event was stored: by the replaying task, it means the transport registers the stream next."""
        replay = self.replay
        if replay is not None and replay.task == anyio.get_current_task().id:
            replay.handed_over.set()

    async def stored(self, seq: int, message: JSONRPCMessage | None) -> None:
        """Event ``seq`` is stored: a priming event signals the handover; a message waits for it."""
        if message is None:
            self.primed()
        elif self.replay is not None:
            await self.after_handover(seq)

    async def after_handover(self, seq: int) -> None:
        """Return once no replay that leaves out event ``seq`` is still handing over (bounded by its deadline)."""
        while (replay := self.replay) is not None and seq > replay.last:
            if replay.task == anyio.get_current_task().id:
                return  # stored from the replay's own callback: waiting would wait for ourselves
            with anyio.move_on_after(replay.deadline - time.monotonic()):
                await replay.handed_over.wait()
            if replay.handed_over.is_set():
                for _ in range(_HANDOVER_TURNS):  # the transport registers the stream in these turns
                    await anyio.lowlevel.checkpoint()
            if self.replay is replay:
                self.replay = None  # handed over, or timed out (the transport never primed the stream)

    async def settled(self, replay: Replay) -> None:
        """Wait (until the replay's deadline) for the puts in flight of the events the replay sends."""
        while any(seq <= replay.last for seq in self.in_flight):
            if self.written is None:
                self.written = anyio.Event()
            with anyio.move_on_after(replay.deadline - time.monotonic()) as scope:
                await self.written.wait()
            if scope.cancelled_caught:
                return

    def settle(self, seq: int, value: JSONRPCMessage | Slot | None) -> None:
        """Event ``seq`` is written (its message) or lost; wake the replays waiting for it."""
        self.in_flight.discard(seq)
        events = self.events
        offset = seq - events[0][0] if events else -1
        if 0 <= offset < len(events):
            events[offset] = (seq, events[offset][1], value)
        if self.written is not None:
            self.written.set()
            self.written = None

    def cached_after(self, anchor: int, ttl: float) -> list[tuple[int, JSONRPCMessage]] | None:
        """The replayable events after ``anchor`` up to the replay's last, or None if the anchor is not held."""
        events = self.events
        offset = anchor - events[0][0] if events else -1
        if not 0 <= offset < len(events):
            return None
        _, stored, value = events[offset]
        if isinstance(value, Slot) or stored <= time.monotonic() - ttl:
            return None
        last = self.next_seq - 1 if self.replay is None else self.replay.last
        later: list[tuple[int, JSONRPCMessage]] = []
        for seq, _, message in itertools.islice(events, offset + 1, None):
            if seq > last or isinstance(message, Slot):
                break  # events the replay leaves to the live stream, or a hole that must not be skipped
            if message is not None:
                later.append((seq, message))
        return later


class Streams:
    """Streams by id and by token, least recently used first, bounded in count and idle time."""

    def __init__(
        self, max_streams: int, max_events_per_stream: int, ttl: float, cache_events_per_stream: int | None = None
    ) -> None:
        """Check each limit, named as the event stores' argument it comes from (None: cache every event)."""
        self.max_streams = _positive_int("max_streams", max_streams)
        self.max_events = _positive_int("max_events_per_stream", max_events_per_stream)
        self.ttl = positive_seconds("ttl", ttl)
        cached = cache_events_per_stream
        if cached is not None:
            cached = _positive_int("cache_events_per_stream", cached, minimum=0)
        self.cached_events = self.max_events if cached is None else min(cached, self.max_events)
        self.by_id: OrderedDict[StreamId, Stream] = OrderedDict()
        self.by_token: dict[str, Stream] = {}

    def touch(self, stream_id: StreamId, now: float) -> Stream:
        """The stream ``stream_id`` (new if unknown), marked as used now; evicts what is over the limits."""
        stream = self.by_id.get(stream_id)
        if stream is None:
            stream = self.by_id[stream_id] = Stream(stream_id, self.cached_events)
            self.by_token[stream.token] = stream
        else:
            self.by_id.move_to_end(stream_id)
        stream.touched = now
        self._evict(now - self.ttl)
        return stream

    def forget(self, stream_id: StreamId) -> None:
        """Drop the stream ``stream_id``: its id, appended to again, starts a new stream (a new token)."""
        stream = self.by_id.pop(stream_id, None)
        if stream is not None:
            del self.by_token[stream.token]

    def _evict(self, idle_before: float) -> None:
        by_id = self.by_id
        while len(by_id) > self.max_streams or next(iter(by_id.values())).touched <= idle_before:
            _, stream = by_id.popitem(last=False)
            del self.by_token[stream.token]


async def send_replay(
    stream: Stream | None,
    replay: Replay | None,
    token: str,
    later: list[tuple[int, JSONRPCMessage]],
    send_callback: EventCallback,
) -> None:
    """Send ``later``; if that fails, release the messages held for this replay's handover."""
    try:
        for seq, message in later:
            await send_callback(EventMessage(message, make_event_id(token, seq)))
    except BaseException:
        if stream is not None and replay is not None:
            stream.abandon(replay)
        raise
