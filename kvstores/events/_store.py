"""StoreEventStore: events in any AsyncKeyValue, and its follower of streams other processes append to."""

from __future__ import annotations

import asyncio
import enum
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, get_args

import anyio
from mcp.server.streamable_http import GET_STREAM_KEY, EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.types import INTERNAL_ERROR, ErrorData, JSONRPCError, JSONRPCMessage, JSONRPCResponse

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
from kvstores.protocol import AsyncKeyValue, AtomicStore
from kvstores.signals import SignalChannel
from kvstores.signals import channel as signals_channel

DEFAULT_CACHE_EVENTS_PER_STREAM = 32
"""Recent events per stream that :class:`StoreEventStore` also keeps in memory, to replay without a round trip."""

EVENTS_COLLECTION = "kvstores_events"
"""The collection :class:`StoreEventStore` writes to by default (not the store's default collection)."""

LEASE_TTL = 3.0
"""Seconds a live :class:`StoreEventStore`'s lease outlives its last refresh: how long a dead runner looks alive."""

LEASE_REFRESH = 1.0
"""Seconds between two refreshes of that lease while the process runs requests."""

FOLLOW_POLL = 0.5
"""Seconds between a follower's reads of the store when no signal wakes it (a signal may be lost)."""

STOPPED_MESSAGE = "The server processing this request stopped before it answered; call again"
"""The JSON-RPC error message a follower sends for a request whose runner's lease lapsed (its terminal record)."""

UNSETTLED_MESSAGE = (
    "The server processing this request stopped answering and its end could not be recorded; "
    "it may still complete: do not call again before checking its effect"
)
"""The JSON-RPC error message a follower sends instead when the store would not take the terminal record in time."""

SIGNALS = "events"
"""The signal channel (kvstores.signals) on which a live StoreEventStore names each followed stream it appended to."""

_FOLLOWS = "events.follow"
"""The signal channel on which a follower names the stream it follows, so that its runner signals that stream."""

_FOLLOW_WINDOW = 16
"""Ring entries a follower reads per round trip (and holds at most)."""

_LEASE_GRACE = 0.5
"""Seconds a runner's lease must stay missing before a follower gives its request up (a lease put may lag)."""

_FENCE_TIMEOUT = 0.5
"""Seconds a follower waits for its terminal record to be written (another process may hold the write lock)."""

_HOLE_GRACE = 2.0
"""Seconds a hole in a followed stream may last before its events count as lost (two puts may land out of order)."""

_LOST_MESSAGE = "Events of this response were lost before they could be delivered; call again"

_FINAL_KINDS = frozenset({JSONRPCResponse.__name__, JSONRPCError.__name__})

_MESSAGE_TYPES: dict[str, type[JSONRPCMessage]] = {kind.__name__: kind for kind in get_args(JSONRPCMessage)}
"""Stored next to each message, so replay validates against one model instead of the union."""

logger = logging.getLogger("kvstores.events")


class StoreEventStore(EventStore):
    """Events in any AsyncKeyValue: one store round trip per append, at most one per replay.

    Layout in ``collection`` (default :data:`EVENTS_COLLECTION`): each stream is a ring of
    ``max_events_per_stream`` entries; event ``seq`` of a stream lives under the key
    ``"<token>:<seq % max_events_per_stream>"`` as ``{"seq", "stream", "kind", "message"}``
    (the message as its wire JSON, ``kind`` its JSON-RPC class; ``"id"``, the request's id as
    sent, when the transport's side told it: :meth:`append`). An append is one ``put``
    with the TTL and overwrites the event ``max_events_per_stream`` places older, so
    trimming costs nothing and a stream never holds more entries than its ring. A replay
    reads the ring in one ``get_many`` and sends the run of events that follows the given
    one, checking each entry's sequence number; it stops at a hole (an event lost while the
    store was failing) rather than skip it.

    The process that appends to a stream also keeps its last ``cache_events_per_stream``
    events in memory (default :data:`DEFAULT_CACHE_EVENTS_PER_STREAM`, or every event,
    ``max_events_per_stream``, over a store that keeps its data in this process's memory
    (``memory://``: a replay then never decodes what it has already decoded); at most
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

    - names each stream it appended to that a follower follows on the signal channel
      :data:`SIGNALS` of the store (:mod:`kvstores.signals`; the message is the stream's
      token, publishes coalesced, never awaited by ``store_event``). A follower names the
      stream it follows on the channel ``"events.follow"``, which every live process
      listens to from its first append; the runner then signals that stream at once (what
      was stored before it heard) and after each later event. A stream nobody follows costs
      no signal; after a GAP on that channel every request stream run here counts as
      followed, and a process that could not listen signals every stream;
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
    a JSON-RPC error (-32603, :data:`STOPPED_MESSAGE`) within :data:`LEASE_TTL` + 1.5 s of
    the runner's death (the lease, a 0.5 s grace, a poll and the record below); when events of
    the stream were lost (the ring lapped, or an event the store failed to keep) it answers
    likewise rather than skip them. Either way the response ends there. The error carries
    the request's id as the client sent it (from the entries; without it, the stream id, an
    int when it is all digits). The SDK's GET stream is replayed, not followed: it never ends.

    One final answer per request (a fencing token). The follower's error is the request's
    terminal record: before sending it, the follower writes it under ``"<token>:end"`` with
    ``put_if_absent`` (``put`` on a store that is not a :class:`kvstores.AtomicStore`) at the
    first sequence number it has not sent, and every read of a stream (each replay's and
    each follower's ``get_many`` reads that key with the window: no extra round trip) takes
    the record in its place and nothing after it. So whatever the old runner stores later,
    thawed from a freeze or slow, is never delivered, on any process, from any event id. If
    another process's record is there first, that one is sent. If the store does not take the
    record within 0.5 s (another process holds SQLite's write lock), the follower still
    answers in time, with :data:`UNSETTLED_MESSAGE`: never a silent success.

    The runner's side: a process whose lease may have lapsed (no renewal returned for
    :data:`LEASE_TTL` seconds: a freeze, a stall, a failing store) gives up every request it
    runs before it stores anything more for them: it records each one's end itself (at the
    first event whose put had not returned in time, so that an event held in a frozen write
    transaction does not count), refuses their later events (logged, not written, not served
    from memory) and calls each request's ``on_fence`` (under :mod:`kvstores.sessions`, the
    request is cancelled as by the client's ``notifications/cancelled``). Each lease renewal
    also reads the records of the requests it runs (one ``get_many``), so a runner learns
    within :data:`LEASE_REFRESH` of an end recorded elsewhere. Writing an event stays one
    ``put``.
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
        self.store = store
        if cache_events_per_stream is None:
            in_process = getattr(type(store), "db_system", None) == "memory"
            cache_events_per_stream = max_events_per_stream if in_process else DEFAULT_CACHE_EVENTS_PER_STREAM
        self.collection = collection
        self.timeout = None if timeout is None else positive_seconds("timeout", timeout)
        self._streams = Streams(max_streams, max_events_per_stream, ttl, cache_events_per_stream)
        self._failing = False
        self.live = live
        """True: signal each stored event and keep a lease while requests run, so other processes follow."""
        self.replica = secrets.token_hex(8)
        """This object's name in its entries and its lease key."""
        self._open: set[str] = set()  # tokens of request streams appended here that have no final response yet
        self._fenced: set[str] = set()  # tokens of request streams given up here: later events are refused
        self._on_fence: dict[str, Callable[[], Awaitable[None]]] = {}  # token -> what cancels its request here
        self._lease: asyncio.Task[None] | None = None
        self._lease_until = 0.0  # monotonic time from which this process's lease may have lapsed
        self._settling: set[asyncio.Task[None]] = set()  # terminal records being written for streams given up
        self._unsignalled: set[str] = set()  # tokens to name on the channel
        self._publisher: asyncio.Task[None] | None = None
        self._no_channel = False
        self._followers: dict[str, set[_Follower]] = {}
        self._unlisten: Callable[[], None] | None = None
        self._listen_lock = anyio.Lock()
        self._followed: set[str] = set()  # tokens of streams appended here that a follower named
        self._follows_heard: SignalChannel | None = None  # the channel this object hears followers on
        self._follows_unheard: SignalChannel | None = None  # a channel it could not listen on: signal all

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
            await self._hear_follows()
        now = time.monotonic()
        stream = self._streams.touch(stream_id, now)
        if stream.token in self._fenced and request_id is not None:  # a new request reuses a given-up one's id
            self._streams.forget(stream_id)
            stream = self._streams.touch(stream_id, now)
        seq = stream.next_seq
        if stream.token in self._fenced:
            logger.debug("event store refused an event of a request given up (its lease lapsed)")
            return make_event_id(stream.token, seq)
        stream.next_seq = seq + 1
        if request_id is not None:
            stream.request_id = request_id
        entry: dict[str, object] = {"seq": seq, "stream": stream_id, "message": None}
        if stream.request_id is not None:
            entry["id"] = stream.request_id
        if message is not None:
            entry.update(
                kind=type(message).__name__, message=message.model_dump_json(by_alias=True, exclude_unset=True)
            )
        final = isinstance(message, (JSONRPCResponse, JSONRPCError))
        if self.live:
            entry["replica"] = self.replica
            self._check_lease(now, {stream.token: seq})
            if stream.token in self._fenced:
                logger.debug("event store refused an event of a request given up (its lease lapsed)")
                return make_event_id(stream.token, seq)
            if on_fence is not None:
                self._on_fence[stream.token] = on_fence
            if not final and not _is_get_stream(stream_id):
                if not self._open:
                    self._lease_until = now + LEASE_TTL  # a new lease: its first put is on its way
                self._open.add(stream.token)
                self._keep_lease()
        stream.events.append((seq, now, Slot.WRITING))
        stream.in_flight.add(seq)
        written = False
        try:
            written = await self._write(stream.token, seq, entry)
        finally:
            stream.settle(seq, message if written else Slot.LOST)
        if self.live:
            # A put that returned after the lease may have lapsed may have landed after a follower's record.
            self._check_lease(time.monotonic(), {stream.token: seq})
            if written:
                self._signal(stream.token)
            if final:
                self._open.discard(stream.token)
                self._on_fence.pop(stream.token, None)
                self._followed.discard(stream.token)
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
            self._check_lease(time.monotonic(), {})
        if token in self._streams.by_token and token not in self._fenced:
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
        parsed = parse_event_id(last_event_id)
        if parsed is None:
            return None
        token, anchor = parsed
        if self.live:
            self._check_lease(time.monotonic(), {})
        stream = None if token in self._fenced else self._streams.by_token.get(token)
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
        await send_replay(stream, replay, token, later, send_callback)
        return stream_id

    async def _follow(
        self, follower: _Follower, token: str, anchor: int, send_callback: EventCallback, prefix: str
    ) -> StreamId | None:
        """Send the events after ``anchor`` of a stream another process appends to, as they come, to its end."""
        read = await self._read(token, anchor, None)
        if read is None:
            return None
        entries, _, fence = read
        first = entries[0]
        if first is None or first.get("seq") != anchor or not str(first.get("stream")).startswith(prefix):
            return None
        if fence is not None and fence["seq"] < anchor:  # the client holds an event the request's end voided
            await send_callback(EventMessage(_decode(fence), make_event_id(token, fence["seq"])))
            return None
        if _is_final(first):
            # The client holds the stream's last event (its response, or its end in place of an event the runner
            # stored there late): nothing follows, and a stream id would keep the response waiting for ever.
            return None
        stream_id = str(first["stream"])
        replica = first.get("replica")
        if not isinstance(replica, str) or _is_get_stream(stream_id):
            # Not a request another live process runs: what the store holds is all there is to send.
            return await self._replay(make_event_id(token, anchor), send_callback, prefix)
        request_id = first["id"] if "id" in first else _request_id(stream_id[len(prefix) :])
        self._announce_follow(token)
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
                    await send_callback(EventMessage(message, make_event_id(token, seq)))
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
            unleased_since = None if lease_seen or taken else unleased_since or now
            ending = None
            if status is _Follow.LOST:
                logger.warning("events of a followed stream were lost; answering its request with an error")
                ending = _LOST_MESSAGE
            elif unleased_since is not None and now - unleased_since >= _LEASE_GRACE:
                logger.info("the process running a followed request stopped; answering it with an error")
                ending = STOPPED_MESSAGE
            if ending is not None:
                terminal = self._terminal(start, stream_id, request_id, ending)
                recorded = await self._record_end(token, terminal, _FENCE_TIMEOUT)
                if recorded:
                    await send_callback(EventMessage(_decode(terminal), make_event_id(token, start)))
                    return None
                if recorded is None:  # never a silent success: the client hears that the outcome is open
                    await send_callback(EventMessage(_error(request_id, UNSETTLED_MESSAGE)))
                    return None
                # Another process recorded the request's end first: the next read sends that one.
            elif status is not _Follow.MORE:
                with anyio.move_on_after(poll):
                    await follower.wake.wait()
            follower.wake = anyio.Event()
            read = await self._read(token, start, replica)
            if read is None:
                pending, lease_seen = [], True  # the store is failing: no verdict on the lease either
                continue
            pending, lease_seen, fence = read
            if fence is not None and fence["seq"] < start:  # ended below what was sent (by the runner itself)
                await send_callback(EventMessage(_decode(fence), make_event_id(token, fence["seq"])))
                return None

    async def _read(
        self, token: str, start: int, replica: str | None
    ) -> tuple[list[dict[str, Any] | None], bool, dict[str, Any] | None] | None:
        """One round trip: the ring entries from ``start`` on (a window, the stream's end applied), whether
        ``replica``'s lease is held, and the stream's terminal record if one was written."""
        window = min(self._streams.max_events, _FOLLOW_WINDOW)
        keys = [self._key(token, seq) for seq in range(start, start + window)] + [_fence_key(token)]
        if replica is not None:
            keys.append(_lease_key(replica))
        try:
            with self._deadline():
                entries = await self.store.get_many(keys, collection=self.collection)
        except Exception as exc:
            self._failed("follow a stream", exc)
            return None
        self._answered()
        fence = entries[window]
        return _ended(entries[:window], start, fence), replica is None or entries[-1] is not None, fence

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

    def _announce_follow(self, token: str) -> None:
        """Name the stream ``token`` on the follows channel: its runner signals it from then on.

        In the background: the follower polls meanwhile, so a store whose write lock another (frozen) process
        holds delays the runner's signals, never the follow.
        """
        signals = self._channel()
        if signals is None:
            return

        async def announce(channel: SignalChannel) -> None:
            try:
                await channel.publish(_FOLLOWS, token)
            except Exception as exc:
                logger.debug("event store could not announce a follow (%r); the follower polls", exc)

        signals.spawn(announce(signals))

    async def _hear_follows(self) -> None:
        """Listen (once per channel) for the streams followers name, before this process appends a first event."""
        signals = self._channel()
        if signals is None or signals is self._follows_heard or signals is self._follows_unheard:
            return
        async with self._listen_lock:
            if signals is self._follows_heard or signals is self._follows_unheard:
                return
            try:
                await signals.listen(_FOLLOWS, self._followed_elsewhere, self._follows_lost)
            except Exception as exc:
                logger.debug("event store cannot hear followers (%r); it signals every stream", exc)
                self._follows_unheard = signals
            else:
                self._follows_heard = signals

    def _followed_elsewhere(self, token: str) -> None:
        """A follower named ``token``: if this process appends to it, signal it now and after each event."""
        if token in self._streams.by_token and token not in self._followed:
            self._followed.add(token)
            self._signal(token)  # what was stored before this was heard

    def _follows_lost(self) -> None:
        """Follows may have been named unheard: every request stream run here counts as followed."""
        for token in self._open - self._followed:
            self._followed.add(token)
            self._signal(token)

    def _signal(self, token: str) -> None:
        """Name ``token`` on the channel soon, if followed; several events stored meanwhile share one message."""
        signals = self._channel()
        if signals is None or (token not in self._followed and signals is not self._follows_unheard):
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
        """Refresh this process's lease while it has request streams without a final response; give up
        those whose end another process recorded (two round trips a refresh, whatever the number of streams)."""
        key = _lease_key(self.replica)
        while True:
            by_token = self._streams.by_token
            self._open.intersection_update(by_token)  # streams evicted from memory are not run here
            self._fenced.intersection_update(by_token)
            self._followed.intersection_update(by_token)
            for evicted in self._on_fence.keys() - by_token.keys():
                del self._on_fence[evicted]
            started = time.monotonic()
            self._check_lease(started, {})
            if not self._open:
                return
            tokens = list(self._open)
            try:
                with self._deadline():
                    await self.store.put(key, {"replica": self.replica}, collection=self.collection, ttl=LEASE_TTL)
                    ends = await self.store.get_many([_fence_key(t) for t in tokens], collection=self.collection)
            except Exception as exc:
                self._failed("renew its lease", exc)
            else:
                self._answered()
                self._lease_until = started + LEASE_TTL
                ended = [token for token, end in zip(tokens, ends) if end is not None and token in self._open]
                if ended:
                    logger.warning("event store: %d request(s) run here were ended elsewhere; cancelling", len(ended))
                    self._give_up(ended, None)
            await asyncio.sleep(LEASE_REFRESH)

    def _check_lease(self, now: float, floors: dict[str, int]) -> None:
        """Give up every request run here when this process's lease may have lapsed (a freeze, a failing store).

        ``floors`` names, per stream, the first event that may have been stored too late to count.
        """
        if self._open and now > self._lease_until:
            logger.warning(
                "event store's lease lapsed (the process stalled, or the store failed): giving up %d request(s);"
                " their later events are refused",
                len(self._open),
            )
            self._give_up(list(self._open), floors)

    def _give_up(self, tokens: list[str], floors: dict[str, int] | None) -> None:
        """Refuse every later event of these request streams and cancel their requests here; with ``floors``,
        also record each one's end (unless a follower recorded it first) at its first event not surely stored."""
        for token in tokens:
            self._open.discard(token)
            self._fenced.add(token)
            stream = self._streams.by_token.get(token)
            if floors is not None and stream is not None:
                seq = floors.get(token, min(stream.in_flight, default=stream.next_seq))
                request_id = stream.request_id
                if request_id is None:
                    request_id = _request_id(stream.stream_id)
                terminal = self._terminal(seq, stream.stream_id, request_id, STOPPED_MESSAGE)
                self._spawn(self._record_end(token, terminal, self.timeout))
            cancel = self._on_fence.pop(token, None)
            if cancel is not None:
                self._spawn(cancel())

    def _spawn(self, work: Awaitable[Any]) -> None:
        async def run() -> None:
            try:
                await work
            except Exception:
                logger.exception("event store: giving up a request failed")

        task = asyncio.get_running_loop().create_task(run())
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    def _terminal(self, seq: int, stream_id: str, request_id: str | int, message: str) -> dict[str, Any]:
        """The entry that ends a request's stream at ``seq`` with a JSON-RPC error: its terminal record."""
        error = _error(request_id, message).model_dump_json(by_alias=True, exclude_unset=True)
        kind, replica = JSONRPCError.__name__, self.replica
        return {"seq": seq, "stream": stream_id, "id": request_id, "kind": kind, "message": error, "replica": replica}

    async def _record_end(self, token: str, terminal: dict[str, Any], within: float | None) -> bool | None:
        """Write ``terminal`` as the stream's end unless one is there (compare-and-set): True if written,
        False if another process's end was there first, None if the store did not take it (logged)."""
        key = _fence_key(token)
        try:
            with nullcontext() if within is None else anyio.fail_after(within):
                if isinstance(self.store, AtomicStore):
                    return await self.store.put_if_absent(
                        key, terminal, collection=self.collection, ttl=self._streams.ttl
                    )
                await self.store.put(key, terminal, collection=self.collection, ttl=self._streams.ttl)
                return True
        except Exception as exc:
            logger.warning("event store could not record the end of a request (%r)", exc)
            return None

    async def _events_after(
        self, token: str, anchor: int, last: int | None
    ) -> tuple[StreamId, list[tuple[int, JSONRPCMessage]]] | None:
        seqs = range(anchor, anchor + self._streams.max_events)
        keys = [self._key(token, seq) for seq in seqs] + [_fence_key(token)]
        *entries, fence = await self.store.get_many(keys, collection=self.collection)
        first = entries[0]
        if first is None or first.get("seq") != anchor:
            return None  # unknown, expired, or overwritten by a later event
        if fence is not None and fence["seq"] < anchor:  # the client holds an event the request's end voided
            return str(fence["stream"]), [(fence["seq"], _decode(fence))]
        entries = _ended(entries, anchor, fence)
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


def _fence_key(token: str) -> str:
    """Where a request stream's terminal record lives: beside its ring (``<token>:<n>``), never one of its slots."""
    return f"{token}:end"


def _ended(entries: list[dict[str, Any] | None], start: int, end: dict[str, Any] | None) -> list[dict[str, Any] | None]:
    """``entries`` (read from sequence number ``start`` on) as the stream's terminal record ``end`` leaves them:
    the record in its place, nothing after it, whatever the runner stored there."""
    if end is None or not start <= end["seq"] < start + len(entries):
        return entries
    cut = end["seq"] - start
    return [*entries[:cut], end, *[None] * (len(entries) - cut - 1)]


def _request_id(stream_id: StreamId) -> int | str:
    """The JSON-RPC id of the request whose stream this is (the SDK names a request's stream ``str(id)``)."""
    return int(stream_id) if re.fullmatch(r"-?[0-9]{1,18}", stream_id) else stream_id


def _error(request_id: int | str, message: str) -> JSONRPCError:
    return JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=INTERNAL_ERROR, message=message))
