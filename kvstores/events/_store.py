"""StoreEventStore: events in any AsyncKeyValue, replayed by any process, followed live between replicas.

Each concern has a module of its own, whose docstring tells its mechanism:

- :mod:`kvstores.events._ring`: the layout in the store (a ring of keys per stream, the
  records, a request's end record) and the store calls on it, failures logged, never raised;
- :mod:`kvstores.events._handover`: each stream's cursor and recent events in memory (the read
  cache below) and the replay's handover to the live stream;
- :mod:`kvstores.events._liveness`: a live process's lease while it runs requests, and the
  requests it gives up when that lease may have lapsed;
- :mod:`kvstores.events._signals`: how runners and followers wake each other;
- :mod:`kvstores.events._follow`: following a stream another process appends to.

The read cache: the process that appends to a stream also keeps its last
``cache_events_per_stream`` events in memory (default :data:`DEFAULT_CACHE_EVENTS_PER_STREAM`,
or every event, ``max_events_per_stream``, over a store that keeps its data in this process's
memory (``memory://``: a replay then never decodes what it has already decoded); at most
``max_events_per_stream``, 0 to keep none), exactly as the store holds them: an event counts
once its ``put`` has returned, and one the store failed to keep is a hole there too. A replay
in that process (the one serving the session, so the one whose live stream the replay hands
over to) from an event still held is served from memory, without a round trip; any other
replay, and every replay while the store is failing, reads the store. Memory for this: at most
``max_streams`` x ``cache_events_per_stream`` messages.

Each stream's next sequence number lives in the memory of the process that serves its session
(bounded by ``max_streams``, least recently used evicted; an evicted stream that goes on
continues under a new token). Every entry expires ``ttl`` seconds after it was written.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable

from mcp.server.streamable_http import EventCallback, EventId, EventStore, StreamId
from mcp.types import JSONRPCError, JSONRPCMessage, JSONRPCResponse

from kvstores.events._follow import Follower
from kvstores.events._handover import (
    DEFAULT_MAX_EVENTS_PER_STREAM,
    DEFAULT_MAX_STREAMS,
    DEFAULT_TTL,
    Slot,
    Streams,
    make_event_id,
    parse_event_id,
    positive_seconds,
    send_replay,
)
from kvstores.events._liveness import Liveness
from kvstores.events._ring import EVENTS_COLLECTION, EventRecord, Ring, ended, is_get_stream
from kvstores.events._signals import StreamSignals
from kvstores.protocol import AsyncKeyValue

DEFAULT_CACHE_EVENTS_PER_STREAM = 32
"""Recent events per stream that :class:`StoreEventStore` also keeps in memory, to replay without a round trip."""

logger = logging.getLogger("kvstores.events")


class StoreEventStore(EventStore):
    """Events in any AsyncKeyValue: one store round trip per append, at most one per replay.

    Events go to ``collection`` (default :data:`EVENTS_COLLECTION`), a ring of
    ``max_events_per_stream`` entries per stream, each expiring ``ttl`` seconds after it was
    written; the appending process also serves replays of the last ``cache_events_per_stream``
    events from memory. Store failures never reach the transport: a store call that raises, or
    takes longer than ``timeout`` seconds (None: the store's own timeout), is logged on the
    ``kvstores.events`` logger; ``store_event`` still returns an id and replay returns None.

    ``live=True`` (:func:`kvstores.sessions.http_app` turns it on): replicas on one store follow
    each other's streams (:meth:`follow_events_after`), each process keeps a lease while it
    runs requests, and a follower answers a request whose runner died with one final error,
    recorded so that nothing the runner stores later is ever delivered. The modules of
    :mod:`kvstores.events` tell each mechanism.
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
        cache_events_per_stream: int | None = None,
        live: bool = False,
    ) -> None:
        if cache_events_per_stream is None:
            in_process = getattr(type(store), "db_system", None) == "memory"
            cache_events_per_stream = max_events_per_stream if in_process else DEFAULT_CACHE_EVENTS_PER_STREAM
        timeout = None if timeout is None else positive_seconds("timeout", timeout)
        self._streams = Streams(max_streams, max_events_per_stream, ttl, cache_events_per_stream)
        self._ring = Ring(store, collection, timeout, self._streams.max_events, self._streams.ttl)
        self.live = live
        """True: signal each stored event and keep a lease while requests run, so other processes follow."""
        self.replica = secrets.token_hex(8)
        """This object's name in its entries and its lease key."""
        self._signals = StreamSignals(store, self._streams, lambda: self._liveness.open)
        self._liveness = Liveness(self._ring, self._streams, self.replica, self._signals.keep_only)
        self._follower = Follower(self._ring, self._signals, self.replica, self._replay)

    @property
    def store(self) -> AsyncKeyValue:
        """The store the events are kept in."""
        return self._ring.store

    @property
    def collection(self) -> str:
        """The collection of ``store`` the events are kept in."""
        return self._ring.collection

    @property
    def timeout(self) -> float | None:
        """Seconds after which a store call counts as failed (None: the store's own timeout)."""
        return self._ring.timeout

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        """Append ``message`` (None: a priming event) to ``stream_id``; return its id, even if the store failed."""
        return await self.append(stream_id, message)

    async def append(
        self,
        stream_id: StreamId,
        message: JSONRPCMessage | None,
        *,
        request_id: str | int | None = None,
        on_fence: Callable[[], Awaitable[None]] | None = None,
    ) -> EventId:
        """:meth:`store_event`, told by the transport's side what it knows of the request behind the stream.

        ``request_id`` is the request's JSON-RPC id exactly as the client sent it: every
        entry of the stream carries it, so that a follower on any process answers with that
        id. ``on_fence`` cancels the request's handling: it is awaited when this process gives
        the request up (its lease lapsed, or a follower recorded the request's end).
        """
        if self.live:  # before a sequence number is taken: this may wait for the channel, once
            await self._signals.hear_follows()
        now = time.monotonic()
        fenced = self._liveness.fenced
        stream = self._streams.touch(stream_id, now)
        if stream.token in fenced and request_id is not None:  # a new request reuses a given-up one's id
            self._streams.forget(stream_id)
            stream = self._streams.touch(stream_id, now)
        seq = stream.next_seq
        if stream.token in fenced:
            logger.debug("event store refused an event of a request given up (its lease lapsed)")
            return make_event_id(stream.token, seq)
        stream.next_seq = seq + 1
        if request_id is not None:
            stream.request_id = request_id
        replica = self.replica if self.live else None
        record = EventRecord.of(seq, stream_id, message, stream.request_id, replica)
        final = isinstance(message, (JSONRPCResponse, JSONRPCError))
        if self.live:
            self._liveness.check(now, {stream.token: seq})
            if stream.token in fenced:
                logger.debug("event store refused an event of a request given up (its lease lapsed)")
                return make_event_id(stream.token, seq)
            request = not final and not is_get_stream(stream_id)
            self._liveness.run(stream.token, on_fence, request=request, now=now)
        stream.events.append((seq, now, Slot.WRITING))
        stream.in_flight.add(seq)
        written = False
        try:
            written = await self._ring.write(stream.token, record)
        finally:
            stream.settle(seq, message if written else Slot.LOST)
        if self.live:
            # A put that returned after the lease may have lapsed may have landed after a follower's record.
            self._liveness.check(time.monotonic(), {stream.token: seq})
            if written:
                self._signals.signal(stream.token)
            if final:
                self._liveness.answered(stream.token)
                self._signals.followed.discard(stream.token)
        await stream.stored(seq, message)
        return make_event_id(stream.token, seq)

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
        response then ends); so do an id of its last event and an unknown id, having sent nothing.
        """
        parsed = parse_event_id(last_event_id)
        if parsed is None:
            return None
        token, anchor = parsed
        if self.live:  # a process whose lease lapsed serves nothing of its requests from memory any more
            self._liveness.check(time.monotonic(), {})
        if token in self._streams.by_token and token not in self._liveness.fenced:
            return await self._replay(last_event_id, send_callback, stream_prefix)
        return await self._follower.follow(token, anchor, send_callback, stream_prefix)

    async def _replay(self, last_event_id: EventId, send_callback: EventCallback, prefix: str) -> StreamId | None:
        parsed = parse_event_id(last_event_id)
        if parsed is None:
            return None
        token, anchor = parsed
        if self.live:
            self._liveness.check(time.monotonic(), {})
        stream = None if token in self._liveness.fenced else self._streams.by_token.get(token)
        replay = None if stream is None else stream.begin_replay()
        found: tuple[StreamId, list[tuple[int, JSONRPCMessage]]] | None = None
        if stream is not None and replay is not None:
            await stream.settled(replay)
            later = None if self._ring.failing else stream.cached_after(anchor, self._streams.ttl)
            found = None if later is None else (stream.stream_id, later)
        if found is None:
            try:
                found = await self._events_after(token, anchor, None if replay is None else replay.last)
            except Exception as exc:
                self._ring.failed("replay events", exc)
            else:
                self._ring.answered()
        if found is None or not found[0].startswith(prefix):
            if stream is not None and replay is not None:
                stream.abandon(replay)
            return None
        stream_id, later = found
        await send_replay(stream, replay, token, later, send_callback)
        return stream_id

    async def _events_after(
        self, token: str, anchor: int, last: int | None
    ) -> tuple[StreamId, list[tuple[int, JSONRPCMessage]]] | None:
        """The stream's id and its events stored after ``anchor`` up to ``last``, from the store; None if unknown."""
        entries, end, _ = await self._ring.read(token, anchor, self._streams.max_events)
        first = entries[0]
        if first is None or first.seq != anchor:
            return None  # unknown, expired, or overwritten by a later event
        if end is not None and end.seq < anchor:  # the client holds an event the request's end voided
            message = end.decode()
            return end.stream, [] if message is None else [(end.seq, message)]
        later: list[tuple[int, JSONRPCMessage]] = []
        for seq, entry in enumerate(ended(entries, anchor, end)[1:], anchor + 1):
            if entry is None or entry.seq != seq or (last is not None and seq > last):
                break  # the end of the stream, a hole that must not be skipped, or what the live stream carries
            message = entry.decode()
            if message is not None:
                later.append((seq, message))
        return first.stream, later
