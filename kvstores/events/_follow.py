"""Following a stream another live process appends to: a replay that goes on until the request's answer.

:meth:`StoreEventStore.follow_events_after` on a process that does not append to the stream
sends what the store holds after the id, then keeps reading the ring by sequence number
whenever the stream is signalled (:mod:`kvstores.events._signals`), after a GAP, and every
:data:`FOLLOW_POLL` seconds in any case, and sends each later event in order, once, until the
stream's final response (a JSON-RPC response or error) has gone out. The store stays the
source of truth. A follower holds one read window (at most 16 events) at a time; each read
also takes the stream's end record and the runner's lease key (one ``get_many``).

When the runner's lease (:mod:`kvstores.events._liveness`) has lapsed and the stream has no
final response, the follower answers the request with a JSON-RPC error (-32603,
:data:`STOPPED_MESSAGE`) within ``LEASE_TTL`` + 1 s of the runner's death (the lease, a 0.5 s
grace, a poll), plus the time the store takes to write the end record; when events of the
stream were lost (the ring lapped, or an event the store failed to keep) it answers likewise
rather than skip them. Either way the response ends there. The error carries the request's id
as the client sent it (from the entries; without it, the stream id, an int when it is all digits).

The error is the request's end record (:mod:`kvstores.events._ring`), written before it is sent;
if another process's record is there first, that one is sent. If the store does not take the
record within :data:`_FENCE_TIMEOUT` (2 s: another process holds SQLite's write lock, the store
is down), the follower answers anyway, with :data:`UNSETTLED_MESSAGE`: never a silent success.
The wait is that long because that answer is the worse one: a loaded machine's store can take
half a second for one write, and "it may still complete" leaves the user to find out. The SDK's
GET stream is replayed, not followed: it never ends.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, StreamId
from mcp.types import JSONRPCMessage

from kvstores.events._handover import make_event_id
from kvstores.events._ring import (
    STOPPED_MESSAGE,
    Entries,
    EventRecord,
    EventRecordError,
    Ring,
    ended,
    error,
    is_get_stream,
    presence_key,
    request_id_of,
)
from kvstores.events._signals import StreamSignals, Waiter

FOLLOW_POLL = 0.5
"""Seconds between a follower's reads of the store when no signal wakes it (a signal may be lost)."""

UNSETTLED_MESSAGE = (
    "The server processing this request stopped answering and its end could not be recorded; "
    "it may still complete: do not call again before checking its effect"
)
"""The JSON-RPC error message a follower sends instead when the store would not take the terminal record in time."""

_FOLLOW_WINDOW = 16
"""Ring entries a follower reads per round trip (and holds at most)."""

_LEASE_GRACE = 0.5
"""Seconds a runner's lease must stay missing before a follower gives its request up (a lease put may lag)."""

_FENCE_TIMEOUT = 2.0
"""Seconds a follower waits for its terminal record to be written (another process may hold the write lock)."""

_HOLE_GRACE = 2.0
"""Seconds a hole in a followed stream may last before its events count as lost (two puts may land out of order)."""

_LOST_MESSAGE = "Events of this response were lost before they could be delivered; call again"

logger = logging.getLogger("kvstores.events")

Replay = Callable[[EventId, EventCallback, str], Awaitable[StreamId | None]]
"""The event store's replay of an id, for a stream's id prefix."""


class Stop(enum.Enum):
    """Where a read of a followed stream stopped."""

    MORE = "more"  # the window was full: read on at once
    WAITING = "waiting"  # the next event is not stored yet
    FINAL = "final"  # the final response was taken
    HOLE = "hole"  # the next event is missing but a later one is stored
    LOST = "lost"  # the next event was overwritten (the ring lapped), or could not be decoded


@dataclass(frozen=True)
class Window:
    """One read of a followed stream: its entries from a sequence number on (the end record applied)."""

    entries: Entries
    end: EventRecord | None
    lease_held: bool
    """False when the runner's lease key was missing (always True when it was not read)."""


class Follower:
    """Follows the streams other processes append to, through one store's ring and signals."""

    def __init__(self, ring: Ring, signals: StreamSignals, replica: str, replay: Replay) -> None:
        """``replica`` names this process in the end records it writes; ``replay`` serves what is not followed."""
        self._ring = ring
        self._signals = signals
        self._replica = replica
        self._replay = replay

    async def follow(self, token: str, anchor: int, send_callback: EventCallback, prefix: str) -> StreamId | None:
        """Send the events after ``anchor`` of a stream another process appends to, as they come, to its end."""
        with self._signals.waiting(token) as waiter:
            await self._signals.listen()
            return await self._follow(waiter, token, anchor, send_callback, prefix)

    async def _follow(
        self, waiter: Waiter, token: str, anchor: int, send_callback: EventCallback, prefix: str
    ) -> StreamId | None:
        window = await self._read(token, anchor, None)
        if window is None:
            return None
        first, end = window.entries[0], window.end
        if first is None or first.seq != anchor or not first.stream.startswith(prefix):
            return None
        if end is not None and end.seq < anchor:  # the client holds an event the request's end voided
            await _send(send_callback, token, end)
            return None
        if first.final:
            # The client holds the stream's last event (its response, or its end in place of an event the runner
            # stored there late): nothing follows, and a stream id would keep the response waiting for ever.
            return None
        stream_id, replica = first.stream, first.replica
        if replica is None or is_get_stream(stream_id):
            # Not a request another live process runs: what the store holds is all there is to send.
            return await self._replay(make_event_id(token, anchor), send_callback, prefix)
        request_id = first.request_id if first.request_id is not None else request_id_of(stream_id[len(prefix) :])
        self._signals.announce(token)
        start, pending, lease_seen = anchor + 1, window.entries[1:], True
        unleased_since: float | None = None
        hole_since: float | None = None
        poll = FOLLOW_POLL if self._signals.listening else FOLLOW_POLL / 5
        while True:
            try:
                taken, status = take(pending, start)
            except ValueError as exc:  # an entry that does not decode
                logger.warning("event store could not follow a stream (%r); ending its response", exc)
                status, taken = Stop.LOST, []
            for seq, message in taken:
                if message is not None:
                    await send_callback(EventMessage(message, make_event_id(token, seq)))
            start += len(taken)
            now = time.monotonic()
            if status is Stop.HOLE:
                hole_since = hole_since or now
                if now - hole_since > _HOLE_GRACE:
                    status = Stop.LOST
            else:
                hole_since = None
            if status is Stop.FINAL:
                return None
            unleased_since = None if lease_seen or taken else unleased_since or now
            ending = None
            if status is Stop.LOST:
                logger.warning("events of a followed stream were lost; answering its request with an error")
                ending = _LOST_MESSAGE
            elif unleased_since is not None and now - unleased_since >= _LEASE_GRACE:
                logger.info("the process running a followed request stopped; answering it with an error")
                ending = STOPPED_MESSAGE
            if ending is not None:
                end = EventRecord.end(start, stream_id, request_id, ending, self._replica)
                recorded = await self._ring.record_end(token, end, _FENCE_TIMEOUT)
                if recorded:
                    await _send(send_callback, token, end)
                    return None
                if recorded is None:  # never a silent success: the client hears that the outcome is open
                    await send_callback(EventMessage(error(request_id, UNSETTLED_MESSAGE)))
                    return None
                # Another process recorded the request's end first: the next read sends that one.
            elif status is not Stop.MORE:
                with anyio.move_on_after(poll):
                    await waiter.wake.wait()
            waiter.wake = anyio.Event()
            window = await self._read(token, start, replica)
            if window is None:
                pending, lease_seen = [], True  # the store is failing: no verdict on the lease either
                continue
            pending, lease_seen, end = window.entries, window.lease_held, window.end
            if end is not None and end.seq < start:  # ended below what was sent (by the runner itself)
                await _send(send_callback, token, end)
                return None

    async def _read(self, token: str, start: int, replica: str | None) -> Window | None:
        """One round trip: the ring entries from ``start`` on, the stream's end, and whether ``replica``'s lease
        is held. None when the store failed (logged)."""
        count = min(self._ring.max_events, _FOLLOW_WINDOW)
        lease = () if replica is None else (presence_key(replica),)
        try:
            entries, end, others = await self._ring.read(token, start, count, *lease)
        except EventRecordError as exc:
            logger.warning("event store could not follow a stream (%r); ending its response", exc)
            return Window([_UNREADABLE], None, True)
        except Exception as exc:
            self._ring.failed("follow a stream", exc)
            return None
        self._ring.answered()
        return Window(ended(entries, start, end), end, not others or others[0] is not None)


_UNREADABLE = EventRecord(-1, "")
"""Stands for a record that could not be read: :func:`take` finds the stream lost there."""


def take(entries: Entries, start: int) -> tuple[list[tuple[int, JSONRPCMessage | None]], Stop]:
    """The run of consecutive events from ``start`` among ``entries`` (read from there), and why it stopped."""
    taken: list[tuple[int, JSONRPCMessage | None]] = []
    for offset, entry in enumerate(entries):
        seq = start + offset
        if entry is _UNREADABLE:
            return taken, Stop.LOST
        if entry is not None and entry.seq == seq:
            taken.append((seq, entry.decode()))
            if entry.final:
                return taken, Stop.FINAL
            continue
        if entry is not None and entry.seq > seq:
            return taken, Stop.LOST
        later = entries[offset + 1 :]
        if any(e is not None and e.seq == seq + 1 + i for i, e in enumerate(later)):
            return taken, Stop.HOLE
        return taken, Stop.WAITING
    return taken, Stop.MORE


async def _send(send_callback: EventCallback, token: str, record: EventRecord) -> None:
    """Send a stream's end record as the event it ends the stream with."""
    message = record.decode()
    if message is not None:
        await send_callback(EventMessage(message, make_event_id(token, record.seq)))
