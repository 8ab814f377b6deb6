"""MCP event stores: let a Streamable HTTP client that lost its stream resume where it left off.

The MCP transport stores every message it sends through an event store and, when a client
reconnects with ``Last-Event-ID``, asks it to replay what came after. Two implementations of
:class:`mcp.server.streamable_http.EventStore`:

- :class:`InMemoryEventStore`: events in process memory.
- :class:`StoreEventStore`: events in any :class:`kvstores.AsyncKeyValue` (SQLite, Redis,
  MongoDB...), so they stay out of process memory and any process sharing the store can replay.

Both pass straight to the MCP SDK and to FastMCP::

    app = mcp.http_app(event_store=StoreEventStore(open_store("redis://localhost")), retry_interval=1000)
    manager = StreamableHTTPSessionManager(server, event_store=InMemoryEventStore())

Guarantees, the same for both:

- Event ids are opaque: ``<stream token>-<sequence number>``, where the token is 128 random
  bits drawn once per stream. An id can only be forged by guessing a token, and an id only
  ever replays the events of its own stream.
- ``replay_events_after(id)`` sends, in order, every event of that id's stream stored after
  it (until the replay began), skips priming events (``message`` None: stored, never replayed) and returns the stream
  id. An unknown, malformed, expired or trimmed id sends nothing and returns None. Replay
  never scans other streams.
- Limits, each a constructor argument: ``max_events_per_stream`` (default
  :data:`DEFAULT_MAX_EVENTS_PER_STREAM`; older events are dropped), ``max_streams`` (default
  :data:`DEFAULT_MAX_STREAMS` streams held in process memory, the least recently used
  evicted first) and ``ttl`` (default :data:`DEFAULT_TTL` seconds: an event is replayable for
  that long after it was stored, and a stream without events for that long is forgotten).
- ``store_event`` never raises: the transport routes every message of a session through it,
  and an exception there would kill the session. A backend failure is logged as a warning
  on the ``kvstores.events`` logger and the message is still delivered live, only without
  resumability.
- A client that resumes while the server is sending loses nothing that this process sends.
  The transport replays, then stores a priming event for the resumed stream, then registers
  the stream for live messages; a message routed to the stream before that registration is
  stored but not sent on the resumed connection (the SDK's replay->live window). So a replay
  sends the events stored before it began, and a message that another task stores on that
  stream while the replay runs is held in ``store_event`` until the replaying task has
  stored its priming event, then a few event-loop turns more: by then the transport has
  registered the stream and sends the message live, in order, once. The hold lasts at most
  :data:`HANDOVER_TIMEOUT` seconds (a client too old for priming events never signals, nor
  does a replay that the caller discards), and nothing is held while no replay of that
  stream is running.

A stream is whatever stream id the transport passes. FastMCP makes them unique per session
(it wraps the store in its ``SessionScopedEventStore``, which also refuses another session's
ids). The plain SDK ``StreamableHTTPSessionManager`` hands one event store to every session
and passes the bare request id (or ``_GET_stream``), and request ids start over in every
session: there, sessions in flight at once that reuse a request id share that stream, as
with the SDK's own example store. Wrap the store per session to isolate them.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import math
import re
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, get_args

import anyio

from kvstores._optional import missing_extra
from kvstores.protocol import AsyncKeyValue
from kvstores.signals import SignalChannel
from kvstores.signals import channel as signals_channel

try:
    from mcp.server.streamable_http import GET_STREAM_KEY, EventCallback, EventId, EventMessage, EventStore, StreamId
    from mcp.types import INTERNAL_ERROR, ErrorData, JSONRPCError, JSONRPCMessage, JSONRPCResponse
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("mcp", "mcp") from exc

__all__ = [
    "DEFAULT_CACHE_EVENTS_PER_STREAM",
    "DEFAULT_MAX_EVENTS_PER_STREAM",
    "DEFAULT_MAX_STREAMS",
    "DEFAULT_TTL",
    "EVENTS_COLLECTION",
    "FOLLOW_POLL",
    "HANDOVER_TIMEOUT",
    "InMemoryEventStore",
    "LEASE_REFRESH",
    "LEASE_TTL",
    "SIGNALS",
    "STOPPED_MESSAGE",
    "StoreEventStore",
]

DEFAULT_MAX_EVENTS_PER_STREAM = 100
"""Events kept per stream; storing one more drops the oldest."""

DEFAULT_MAX_STREAMS = 10_000
"""Streams tracked at once; a new stream beyond it evicts the least recently used."""

DEFAULT_TTL = 3600.0
"""Seconds an event stays replayable after it was stored."""

DEFAULT_CACHE_EVENTS_PER_STREAM = 32
"""Recent events per stream that :class:`StoreEventStore` also keeps in memory, to replay without a round trip."""

HANDOVER_TIMEOUT = 1.0
"""Seconds at most that ``store_event`` holds a message back while a replay of its stream hands over."""

EVENTS_COLLECTION = "kvstores_events"
"""The collection :class:`StoreEventStore` writes to by default (not the store's default collection)."""

LEASE_TTL = 3.0
"""Seconds a live :class:`StoreEventStore`'s lease outlives its last refresh: how long a dead runner looks alive."""

LEASE_REFRESH = 1.0
"""Seconds between two refreshes of that lease while the process runs requests."""

FOLLOW_POLL = 0.5
"""Seconds between a follower's reads of the store when no signal wakes it (a signal may be lost)."""

STOPPED_MESSAGE = "The server processing this request stopped before it answered; call again"
"""The JSON-RPC error message a follower sends for a request whose runner's lease lapsed."""

SIGNALS = "events"
"""The signal channel (kvstores.signals) on which a live StoreEventStore names each stream it appended to."""

logger = logging.getLogger("kvstores.events")

_EVENT_ID = re.compile(r"([0-9a-f]{32})-(0|[1-9][0-9]{0,17})\Z")
_MESSAGE_TYPES: dict[str, type[JSONRPCMessage]] = {kind.__name__: kind for kind in get_args(JSONRPCMessage)}
"""Stored next to each message, so replay validates against one model instead of the union."""


def _event_id(token: str, seq: int) -> EventId:
    return f"{token}-{seq}"


def _parse_event_id(event_id: object) -> tuple[str, int] | None:
    """``(token, seq)`` of an id this module minted, or None for anything else."""
    match = _EVENT_ID.match(event_id) if isinstance(event_id, str) else None
    return None if match is None else (match[1], int(match[2]))


def _positive_int(name: str, value: int, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _positive_seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


_HANDOVER_TURNS = 8
"""Event-loop turns a held message waits after the priming event: the transport needs one or two to register."""


class _Slot(enum.Enum):
    """A cached event that cannot be replayed (yet): a replay stops there rather than skip it."""

    WRITING = "writing"  # its put is in flight
    LOST = "lost"  # the store failed to keep it


_Event = tuple[int, float, JSONRPCMessage | _Slot | None]
"""(sequence number, monotonic time stored, message: None for a priming event)."""


class _Replay:
    """A replay in progress: the task running it and the last event it sends; set ``handed_over`` when done."""

    __slots__ = ("deadline", "handed_over", "last", "task")

    def __init__(self, last: int) -> None:
        self.task = anyio.get_current_task().id
        self.last = last
        self.deadline = time.monotonic() + HANDOVER_TIMEOUT
        self.handed_over = anyio.Event()


class _Stream:
    """One stream's cursor: its random token, next sequence number, recent events and the replay under way."""

    __slots__ = ("events", "in_flight", "next_seq", "replay", "stream_id", "token", "touched", "written")

    def __init__(self, stream_id: StreamId, max_events: int) -> None:
        self.stream_id = stream_id
        self.token = secrets.token_hex(16)
        self.next_seq = 0
        self.touched = 0.0
        self.events: deque[_Event] = deque(maxlen=max_events)
        self.replay: _Replay | None = None
        self.in_flight: set[int] = set()  # messages whose put has not returned yet
        self.written: anyio.Event | None = None  # set (and dropped) when one of them returns

    def begin_replay(self) -> _Replay:
        """Record a replay of the events stored so far; later messages of other tasks wait for its handover."""
        self.replay = replay = _Replay(self.next_seq - 1)
        return replay

    def abandon(self, replay: _Replay) -> None:
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

    async def settled(self, replay: _Replay) -> None:
        """Wait (until the replay's deadline) for the puts in flight of the events the replay sends."""
        while any(seq <= replay.last for seq in self.in_flight):
            if self.written is None:
                self.written = anyio.Event()
            with anyio.move_on_after(replay.deadline - time.monotonic()) as scope:
                await self.written.wait()
            if scope.cancelled_caught:
                return

    def settle(self, seq: int, value: JSONRPCMessage | _Slot | None) -> None:
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
        if isinstance(value, _Slot) or stored <= time.monotonic() - ttl:
            return None
        last = self.next_seq - 1 if self.replay is None else self.replay.last
        later: list[tuple[int, JSONRPCMessage]] = []
        for seq, _, message in itertools.islice(events, offset + 1, None):
            if seq > last or isinstance(message, _Slot):
                break  # events the replay leaves to the live stream, or a hole that must not be skipped
            if message is not None:
                later.append((seq, message))
        return later


class _Streams:
    """Streams by id and by token, least recently used first, bounded in count and idle time."""

    def __init__(self, max_streams: int, max_events: int, ttl: float, cached_events: int | None = None) -> None:
        self.max_streams = max_streams
        self.max_events = max_events
        self.cached_events = max_events if cached_events is None else min(cached_events, max_events)
        self.ttl = ttl
        self.by_id: OrderedDict[StreamId, _Stream] = OrderedDict()
        self.by_token: dict[str, _Stream] = {}

    def touch(self, stream_id: StreamId, now: float) -> _Stream:
        """The stream ``stream_id`` (new if unknown), marked as used now; evicts what is over the limits."""
        stream = self.by_id.get(stream_id)
        if stream is None:
            stream = self.by_id[stream_id] = _Stream(stream_id, self.cached_events)
            self.by_token[stream.token] = stream
        else:
            self.by_id.move_to_end(stream_id)
        stream.touched = now
        self._evict(now - self.ttl)
        return stream

    def _evict(self, idle_before: float) -> None:
        by_id = self.by_id
        while len(by_id) > self.max_streams or next(iter(by_id.values())).touched <= idle_before:
            _, stream = by_id.popitem(last=False)
            del self.by_token[stream.token]


async def _send(
    stream: _Stream | None,
    replay: _Replay | None,
    token: str,
    later: list[tuple[int, JSONRPCMessage]],
    send_callback: EventCallback,
) -> None:
    """Send ``later``; if that fails, release the messages held for this replay's handover."""
    try:
        for seq, message in later:
            await send_callback(EventMessage(message, _event_id(token, seq)))
    except BaseException:
        if stream is not None and replay is not None:
            stream.abandon(replay)
        raise


class InMemoryEventStore(EventStore):
    """Events in process memory: O(1) append, bounded by streams x events per stream.

    Memory holds at most ``max_streams`` streams of ``max_events_per_stream`` events each
    (defaults :data:`DEFAULT_MAX_STREAMS` and :data:`DEFAULT_MAX_EVENTS_PER_STREAM`); an
    event is replayable for ``ttl`` seconds (default :data:`DEFAULT_TTL`). Events live in
    this process only: use :class:`StoreEventStore` to share them between replicas.
    """

    def __init__(
        self,
        *,
        max_events_per_stream: int = DEFAULT_MAX_EVENTS_PER_STREAM,
        max_streams: int = DEFAULT_MAX_STREAMS,
        ttl: float = DEFAULT_TTL,
    ) -> None:
        self._streams = _Streams(
            _positive_int("max_streams", max_streams),
            _positive_int("max_events_per_stream", max_events_per_stream),
            _positive_seconds("ttl", ttl),
        )

    @property
    def stream_count(self) -> int:
        """How many streams are held now (at most ``max_streams``)."""
        return len(self._streams.by_id)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        """Append ``message`` (None: a priming event) to ``stream_id``; return its event id."""
        now = time.monotonic()
        stream = self._streams.touch(stream_id, now)
        seq = stream.next_seq
        stream.next_seq = seq + 1
        stream.events.append((seq, now, message))
        await stream.stored(seq, message)
        return _event_id(stream.token, seq)

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        """Send every later non-priming event of ``last_event_id``'s stream; return the stream id or None."""
        parsed = _parse_event_id(last_event_id)
        stream = None if parsed is None else self._streams.by_token.get(parsed[0])
        if parsed is None or stream is None:
            return None
        replay = stream.begin_replay()
        later = stream.cached_after(parsed[1], self._streams.ttl)
        if later is None:
            stream.abandon(replay)
            return None
        await _send(stream, replay, stream.token, later, send_callback)
        return stream.stream_id


class StoreEventStore(EventStore):
    """Events in any AsyncKeyValue: one store round trip per append, at most one per replay.

    Layout in ``collection`` (default :data:`EVENTS_COLLECTION`): each stream is a ring of
    ``max_events_per_stream`` entries; event ``seq`` of a stream lives under the key
    ``"<token>:<seq % max_events_per_stream>"`` as ``{"seq", "stream", "kind", "message"}``
    (the message as its wire JSON, ``kind`` its JSON-RPC class). An append is one ``put``
    with the TTL and overwrites the event ``max_events_per_stream`` places older, so
    trimming costs nothing and a stream never holds more entries than its ring. A replay
    reads the ring in one ``get_many`` and sends the run of events that follows the given
    one, checking each entry's sequence number; it stops at a hole (an event lost while the
    store was failing) rather than skip it.

    The process that appends to a stream also keeps its last ``cache_events_per_stream``
    events in memory (default :data:`DEFAULT_CACHE_EVENTS_PER_STREAM`, at most
    ``max_events_per_stream``, 0 to keep none), exactly as the store holds them: an event
    counts once its ``put`` has returned, and one the store failed to keep is a hole there
    too. A replay in that process (the one serving the session, so the one whose live stream
    the replay hands over to) from an event still held is served from memory, without a
    round trip; any other replay, and every replay while the store is failing, reads the
    store. Memory for this: at most ``max_streams`` x ``cache_events_per_stream`` messages.

    Every entry expires ``ttl`` seconds after it was written (default :data:`DEFAULT_TTL`).
    Each stream's next sequence number lives in the memory of the process that serves its
    session (bounded by ``max_streams``, least recently used evicted; an evicted stream
    that goes on continues under a new token). Any process sharing the store can replay.

    Failures never reach the transport: when a store call raises, or takes longer than
    ``timeout`` seconds, a warning goes to the ``kvstores.events`` logger (once per outage,
    then debug messages until the store answers again); ``store_event`` still returns an
    id and replay returns None. ``timeout`` defaults to None, which relies on the store's
    own timeout (every kvstores backend has one); set it for a store that might hang.

    Live streams (``live=True``; :func:`kvstores.sessions.http_app` turns it on): replicas
    on one store follow each other's streams. The process that appends:

    - names each stream it appended to on the signal channel :data:`SIGNALS` of the store
      (:mod:`kvstores.signals`; the message is the stream's token, publishes coalesced,
      never awaited by ``store_event``);
    - keeps a lease, ``"replica:<id>"`` in ``collection``, while it has request streams
      without a final response: a ``put`` with a :data:`LEASE_TTL` TTL every
      :data:`LEASE_REFRESH` seconds (one per process, whatever the number of streams); each
      entry it writes names its replica.

    :meth:`follow_events_after` is the replay that goes on: on a process that does not append
    to the stream, it sends what the store holds after the id, then keeps reading the store
    by sequence number whenever the stream is signalled, after a GAP, and every
    :data:`FOLLOW_POLL` seconds in any case, and sends each later event in order, once, until
    the stream's final response (a JSON-RPC response or error) has gone out. The store stays
    the source of truth: a lost signal delays an event, never drops or repeats it. A
    follower holds one read window (at most 16 events) at a time. When the runner's lease
    has lapsed and the stream has no final response, the follower answers the request with
    a JSON-RPC error (-32603, :data:`STOPPED_MESSAGE`) within :data:`LEASE_TTL` + 1 s of the
    runner's death; when events of the stream were lost (the ring lapped, or an event the
    store failed to keep) it answers likewise rather than skip them. Either way the
    response ends there. A request's id is its stream id (an int when it is all digits).
    The SDK's GET stream is replayed, not followed: it never ends.
    """

    def __init__(
        self,
        store: AsyncKeyValue,
        *,
        collection: str = EVENTS_COLLECTION,
        max_events_per_stream: int = DEFAULT_MAX_EVENTS_PER_STREAM,
        max_streams: int = DEFAULT_MAX_STREAMS,
        ttl: float = DEFAULT_TTL,
        timeout: float | None = None,
        cache_events_per_stream: int = DEFAULT_CACHE_EVENTS_PER_STREAM,
        live: bool = False,
    ) -> None:
        self.store = store
        self.collection = collection
        self.timeout = None if timeout is None else _positive_seconds("timeout", timeout)
        self._streams = _Streams(
            _positive_int("max_streams", max_streams),
            _positive_int("max_events_per_stream", max_events_per_stream),
            _positive_seconds("ttl", ttl),
            _positive_int("cache_events_per_stream", cache_events_per_stream, minimum=0),
        )
        self._failing = False
        self.live = live
        """True: signal each stored event and keep a lease while requests run, so other processes follow."""
        self.replica = secrets.token_hex(8)
        """This object's name in its entries and its lease key."""
        self._open: set[str] = set()  # tokens of request streams appended here that have no final response yet
        self._lease: asyncio.Task[None] | None = None
        self._unsignalled: set[str] = set()  # tokens to name on the channel
        self._publisher: asyncio.Task[None] | None = None
        self._no_channel = False
        self._followers: dict[str, set[_Follower]] = {}
        self._unlisten: Callable[[], None] | None = None
        self._listen_lock = anyio.Lock()

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        """Append ``message`` (None: a priming event) to ``stream_id``; return its id, even if the store failed."""
        now = time.monotonic()
        stream = self._streams.touch(stream_id, now)
        seq = stream.next_seq
        stream.next_seq = seq + 1
        entry: dict[str, object] = {"seq": seq, "stream": stream_id, "message": None}
        if message is not None:
            entry.update(
                kind=type(message).__name__, message=message.model_dump_json(by_alias=True, exclude_unset=True)
            )
        final = isinstance(message, (JSONRPCResponse, JSONRPCError))
        if self.live:
            entry["replica"] = self.replica
            if not final and not _is_get_stream(stream_id):
                self._open.add(stream.token)
                self._keep_lease()
        stream.events.append((seq, now, _Slot.WRITING))
        stream.in_flight.add(seq)
        written = False
        try:
            written = await self._write(stream.token, seq, entry)
        finally:
            stream.settle(seq, message if written else _Slot.LOST)
        if self.live:
            if final:
                self._open.discard(stream.token)
            if written:
                self._signal(stream.token)
        await stream.stored(seq, message)
        return _event_id(stream.token, seq)

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        """Send every later non-priming event of ``last_event_id``'s stream; return the stream id or None."""
        return await self._replay(last_event_id, send_callback, "")

    async def follow_events_after(
        self, last_event_id: EventId, send_callback: EventCallback, *, stream_prefix: str = ""
    ) -> StreamId | None:
        """Replay, then go on sending the stream's events as any process stores them, until its final response.

        Only streams whose id starts with ``stream_prefix`` are sent (a session's view). A stream
        this process appends to is replayed and its stream id returned: the transport sends
        what follows live. A followed stream returns None once its last event went out (the
        response then ends); so does an unknown id, having sent nothing.
        """
        parsed = _parse_event_id(last_event_id)
        if parsed is None:
            return None
        token, anchor = parsed
        if token in self._streams.by_token:
            return await self._replay(last_event_id, send_callback, stream_prefix)
        follower = _Follower()
        self._followers.setdefault(token, set()).add(follower)
        try:
            await self._listen()
            return await self._follow(follower, token, anchor, send_callback, stream_prefix)
        finally:
            followers = self._followers.get(token)
            if followers is not None:
                followers.discard(follower)
                if not followers:
                    del self._followers[token]

    async def _replay(self, last_event_id: EventId, send_callback: EventCallback, prefix: str) -> StreamId | None:
        parsed = _parse_event_id(last_event_id)
        if parsed is None:
            return None
        token, anchor = parsed
        stream = self._streams.by_token.get(token)
        replay = None if stream is None else stream.begin_replay()
        found: tuple[StreamId, list[tuple[int, JSONRPCMessage]]] | None = None
        if stream is not None and replay is not None:
            await stream.settled(replay)
            later = None if self._failing else stream.cached_after(anchor, self._streams.ttl)
            found = None if later is None else (stream.stream_id, later)
        if found is None:
            try:
                with self._deadline():
                    found = await self._events_after(token, anchor, None if replay is None else replay.last)
            except Exception as exc:
                self._failed("replay events", exc)
            else:
                self._answered()
        if found is None or not found[0].startswith(prefix):
            if stream is not None and replay is not None:
                stream.abandon(replay)
            return None
        stream_id, later = found
        await _send(stream, replay, token, later, send_callback)
        return stream_id

    async def _follow(
        self, follower: _Follower, token: str, anchor: int, send_callback: EventCallback, prefix: str
    ) -> StreamId | None:
        """Send the events after ``anchor`` of a stream another process appends to, as they come, to its end."""
        read = await self._read(token, anchor, None)
        if read is None:
            return None
        entries, _ = read
        first = entries[0]
        if first is None or first.get("seq") != anchor or not str(first.get("stream")).startswith(prefix):
            return None
        stream_id = str(first["stream"])
        replica = first.get("replica")
        if not isinstance(replica, str) or _is_get_stream(stream_id) or _is_final(first):
            # Not a request another live process runs: what the store holds is all there is to send.
            return await self._replay(_event_id(token, anchor), send_callback, prefix)
        request_id = _request_id(stream_id[len(prefix) :])
        start, pending, lease_seen = anchor + 1, entries[1:], True
        unleased_since: float | None = None
        hole_since: float | None = None
        poll = FOLLOW_POLL if self._unlisten is not None else FOLLOW_POLL / 5
        while True:
            try:
                taken, status = _take(pending, start)
            except (ValueError, KeyError) as exc:  # an entry that does not decode
                logger.warning("event store could not follow a stream (%r); ending its response", exc)
                status, taken = _Follow.LOST, []
            for seq, message in taken:
                if message is not None:
                    await send_callback(EventMessage(message, _event_id(token, seq)))
            start += len(taken)
            now = time.monotonic()
            if status is _Follow.HOLE:
                hole_since = hole_since or now
                if now - hole_since > _HOLE_GRACE:
                    status = _Follow.LOST
            else:
                hole_since = None
            if status is _Follow.FINAL:
                return None
            if status is _Follow.LOST:
                logger.warning("events of a followed stream were lost; answering its request with an error")
                await send_callback(EventMessage(_error(request_id, _LOST_MESSAGE)))
                return None
            unleased_since = None if lease_seen or taken else unleased_since or now
            if unleased_since is not None and now - unleased_since >= _LEASE_GRACE:
                logger.info("the process running a followed request stopped; answering it with an error")
                await send_callback(EventMessage(_error(request_id, STOPPED_MESSAGE)))
                return None
            if status is not _Follow.MORE:
                with anyio.move_on_after(poll):
                    await follower.wake.wait()
            follower.wake = anyio.Event()
            read = await self._read(token, start, replica)
            if read is None:
                pending, lease_seen = [], True  # the store is failing: no verdict on the lease either
            else:
                pending, lease_seen = read

    async def _read(
        self, token: str, start: int, replica: str | None
    ) -> tuple[list[dict[str, Any] | None], bool] | None:
        """One round trip: the ring entries from ``start`` on (a window) and whether ``replica``'s lease is held."""
        window = min(self._streams.max_events, _FOLLOW_WINDOW)
        keys = [self._key(token, seq) for seq in range(start, start + window)]
        if replica is not None:
            keys.append(_lease_key(replica))
        try:
            with self._deadline():
                entries = await self.store.get_many(keys, collection=self.collection)
        except Exception as exc:
            self._failed("follow a stream", exc)
            return None
        self._answered()
        if replica is None:
            return entries, True
        return entries[:-1], entries[-1] is not None

    async def _listen(self) -> None:
        """Start waking followers on this store's signals (once; without a channel, followers poll faster)."""
        if self._unlisten is not None or self._no_channel:
            return
        async with self._listen_lock:
            signals = self._channel()
            if self._unlisten is None and signals is not None:
                try:
                    self._unlisten = await signals.listen(SIGNALS, self._wake, self._wake_all)
                except Exception as exc:
                    logger.debug("event store cannot listen to signals (%r); followers poll", exc)

    def _wake(self, token: str) -> None:
        for follower in self._followers.get(token, ()):
            follower.wake.set()

    def _wake_all(self) -> None:
        for followers in self._followers.values():
            for follower in followers:
                follower.wake.set()

    def _channel(self) -> SignalChannel | None:
        """The store's signal channel, or None when the store has none (a foreign store)."""
        if self._no_channel:
            return None
        try:
            return signals_channel(self.store)
        except TypeError:
            self._no_channel = True
            return None

    def _signal(self, token: str) -> None:
        """Name ``token`` on the channel soon; several events of a stream stored meanwhile share one message."""
        if self._channel() is None:
            return
        self._unsignalled.add(token)
        if self._publisher is None or self._publisher.done():
            self._publisher = asyncio.get_running_loop().create_task(self._publish())

    async def _publish(self) -> None:
        while self._unsignalled and (signals := self._channel()) is not None:
            token = self._unsignalled.pop()
            try:
                await signals.publish(SIGNALS, token)
            except Exception as exc:
                logger.debug("event store could not signal a stream (%r); followers poll", exc)

    def _keep_lease(self) -> None:
        if self._lease is None or self._lease.done():
            self._lease = asyncio.get_running_loop().create_task(self._renew_lease())

    async def _renew_lease(self) -> None:
        """Refresh this process's lease while it has request streams without a final response."""
        key = _lease_key(self.replica)
        while True:
            self._open.intersection_update(self._streams.by_token)  # streams evicted from memory are not run here
            if not self._open:
                return
            try:
                with self._deadline():
                    await self.store.put(key, {"replica": self.replica}, collection=self.collection, ttl=LEASE_TTL)
            except Exception as exc:
                self._failed("renew its lease", exc)
            else:
                self._answered()
            await asyncio.sleep(LEASE_REFRESH)

    async def _events_after(
        self, token: str, anchor: int, last: int | None
    ) -> tuple[StreamId, list[tuple[int, JSONRPCMessage]]] | None:
        seqs = range(anchor, anchor + self._streams.max_events)
        entries = await self.store.get_many([self._key(token, seq) for seq in seqs], collection=self.collection)
        first = entries[0]
        if first is None or first.get("seq") != anchor:
            return None  # unknown, expired, or overwritten by a later event
        later: list[tuple[int, JSONRPCMessage]] = []
        for seq, entry in zip(seqs[1:], entries[1:]):
            if entry is None or entry.get("seq") != seq or (last is not None and seq > last):
                break  # the end of the stream, a hole that must not be skipped, or what the live stream carries
            if entry["message"] is not None:
                later.append((seq, _decode(entry)))
        return str(first["stream"]), later

    async def _write(self, token: str, seq: int, entry: dict[str, object]) -> bool:
        """Put one event; log a failure instead of raising it. True if the store kept it."""
        try:
            with self._deadline():
                await self.store.put(self._key(token, seq), entry, collection=self.collection, ttl=self._streams.ttl)
        except Exception as exc:
            self._failed("store an event", exc)
            return False
        self._answered()
        return True

    def _key(self, token: str, seq: int) -> str:
        return f"{token}:{seq % self._streams.max_events}"

    def _deadline(self) -> AbstractContextManager[object]:
        return nullcontext() if self.timeout is None else anyio.fail_after(self.timeout)

    def _failed(self, action: str, exc: Exception) -> None:
        level = logging.DEBUG if self._failing else logging.WARNING
        self._failing = True
        logger.log(level, "event store could not %s (%r); streams stay live but cannot resume", action, exc)

    def _answered(self) -> None:
        if self._failing:
            self._failing = False
            logger.info("event store answers again; new events are resumable")


_FOLLOW_WINDOW = 16
"""Ring entries a follower reads per round trip (and holds at most)."""

_LEASE_GRACE = 0.5
"""Seconds a runner's lease must stay missing before a follower gives its request up (a lease put may lag)."""

_HOLE_GRACE = 2.0
"""Seconds a hole in a followed stream may last before its events count as lost (two puts may land out of order)."""

_LOST_MESSAGE = "Events of this response were lost before they could be delivered; call again"

_FINAL_KINDS = frozenset({JSONRPCResponse.__name__, JSONRPCError.__name__})


class _Follower:
    """One follow in progress: the event its stream's signals set."""

    __slots__ = ("wake",)

    def __init__(self) -> None:
        self.wake = anyio.Event()


class _Follow(enum.Enum):
    """Where a read of a followed stream stopped."""

    MORE = "more"  # the window was full: read on at once
    WAITING = "waiting"  # the next event is not stored yet
    FINAL = "final"  # the final response was taken
    HOLE = "hole"  # the next event is missing but a later one is stored
    LOST = "lost"  # the next event was overwritten (the ring lapped), or could not be decoded


def _take(entries: list[dict[str, Any] | None], start: int) -> tuple[list[tuple[int, JSONRPCMessage | None]], _Follow]:
    """The run of consecutive events from ``start`` among ``entries`` (read from there), and why it stopped."""
    taken: list[tuple[int, JSONRPCMessage | None]] = []
    for offset, entry in enumerate(entries):
        seq = start + offset
        found = None if entry is None else entry.get("seq")
        if entry is not None and found == seq:
            taken.append((seq, None if entry["message"] is None else _decode(entry)))
            if _is_final(entry):
                return taken, _Follow.FINAL
            continue
        if isinstance(found, int) and found > seq:
            return taken, _Follow.LOST
        later = entries[offset + 1 :]
        if any(e is not None and e.get("seq") == seq + 1 + i for i, e in enumerate(later)):
            return taken, _Follow.HOLE
        return taken, _Follow.WAITING
    return taken, _Follow.MORE


def _decode(entry: dict[str, Any]) -> JSONRPCMessage:
    return _MESSAGE_TYPES[entry["kind"]].model_validate_json(entry["message"])


def _is_final(entry: dict[str, Any]) -> bool:
    return entry.get("kind") in _FINAL_KINDS


def _is_get_stream(stream_id: StreamId) -> bool:
    """True for the SDK's standalone GET stream (also under a session's prefix): it carries no request."""
    return stream_id == GET_STREAM_KEY or stream_id.endswith(":" + GET_STREAM_KEY)


def _lease_key(replica: str) -> str:
    return f"replica:{replica}"


def _request_id(stream_id: StreamId) -> int | str:
    """The JSON-RPC id of the request whose stream this is (the SDK names a request's stream ``str(id)``)."""
    return int(stream_id) if re.fullmatch(r"-?[0-9]{1,18}", stream_id) else stream_id


def _error(request_id: int | str, message: str) -> JSONRPCError:
    return JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=INTERNAL_ERROR, message=message))
