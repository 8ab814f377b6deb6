"""InMemoryEventStore: events in process memory."""

from __future__ import annotations

import time

from mcp.server.streamable_http import EventCallback, EventId, EventStore, StreamId
from mcp.types import JSONRPCMessage

from kvstores.events._handover import (
    DEFAULT_MAX_EVENTS_PER_STREAM,
    DEFAULT_MAX_STREAMS,
    DEFAULT_TTL,
    Streams,
    make_event_id,
    parse_event_id,
    send_replay,
)


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
        self._streams = Streams(max_streams, max_events_per_stream, ttl)

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
        return make_event_id(stream.token, seq)

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        """Send every later non-priming event of ``last_event_id``'s stream; return the stream id or None."""
        parsed = parse_event_id(last_event_id)
        stream = None if parsed is None else self._streams.by_token.get(parsed[0])
        if parsed is None or stream is None:
            return None
        replay = stream.begin_replay()
        later = stream.cached_after(parsed[1], self._streams.ttl)
        if later is None:
            stream.abandon(replay)
            return None
        await send_replay(stream, replay, stream.token, later, send_callback)
        return stream.stream_id
