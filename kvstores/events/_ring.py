"""Where StoreEventStore keeps events: each stream a ring of keys, its records, and the store calls on them.

The layout in the event store's collection (default :data:`EVENTS_COLLECTION`):

- **The ring.** Each stream is a ring of ``max_events_per_stream`` entries: event ``seq`` of a
  stream lives under ``"<token>:<seq % max_events_per_stream>"`` as an :class:`EventRecord`
  (the message as its wire JSON, its JSON-RPC class, the request's id as sent when the
  transport's side told it, and the live replica that wrote it). An append is one ``put``
  with the TTL and overwrites the event ``max_events_per_stream`` places older, so trimming
  costs nothing and a stream never holds more entries than its ring. A replay reads the ring
  in one ``get_many`` and sends the run of events that follows the given one, checking each
  entry's sequence number; it stops at a hole (an event lost while the store was failing)
  rather than skip it.
- **The end record.** A request stream given up (its runner's lease lapsed, or its events
  were lost) is ended by a terminal record under ``"<token>:end"``: a JSON-RPC error at the
  first sequence number not delivered, written once (``put_if_absent``; ``put`` on a store that
  is not a :class:`kvstores.AtomicStore`). Every read of a stream takes that key with its
  window (no extra round trip) and applies it (:func:`ended`): the record in its place, nothing
  after it, whatever the runner stored there later.
- **Presence keys.** ``"replica:<id>"``: a live process's lease (:mod:`kvstores.events._liveness`).

Failures never reach the transport: a store call that raises, or takes longer than
``timeout`` seconds, is logged as a warning on the ``kvstores.events`` logger (once per
outage, then debug messages until the store answers again).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeGuard, get_args

import anyio
from mcp.server.streamable_http import GET_STREAM_KEY, StreamId
from mcp.types import INTERNAL_ERROR, ErrorData, JSONRPCError, JSONRPCMessage, JSONRPCResponse

from kvstores.protocol import AsyncKeyValue, AtomicStore

EVENTS_COLLECTION = "kvstores_events"
"""The collection :class:`StoreEventStore` writes to by default (not the store's default collection)."""

STOPPED_MESSAGE = "The server processing this request stopped before it answered; call again"
"""The JSON-RPC error message a follower sends for a request whose runner's lease lapsed (its terminal record)."""

RECORD_VERSION = 1
"""The layout version of event records; version 1 is written without a ``"v"`` field."""

_MESSAGE_TYPES: dict[str, type[JSONRPCMessage]] = {kind.__name__: kind for kind in get_args(JSONRPCMessage)}
"""Stored next to each message, so replay validates against one model instead of the union."""

_FINAL_KINDS = frozenset({JSONRPCResponse.__name__, JSONRPCError.__name__})

logger = logging.getLogger("kvstores.events")


class EventRecordError(ValueError):
    """A stored event record that cannot be read (another layout version, or corrupt)."""


@dataclass(frozen=True)
class EventRecord:
    """One event of a stream as stored: a message (None: a priming event), or the stream's end record."""

    seq: int
    stream: StreamId
    kind: str | None = None
    """The message's JSON-RPC class name (None for a priming event)."""
    message: str | None = None
    """The message as its wire JSON."""
    request_id: str | int | None = None
    """The request's JSON-RPC id as the client sent it, stored as ``"id"`` (None: not told)."""
    replica: str | None = None
    """The live :class:`StoreEventStore` that wrote it (None: not live)."""

    @classmethod
    def of(
        cls,
        seq: int,
        stream: StreamId,
        message: JSONRPCMessage | None,
        request_id: str | int | None,
        replica: str | None,
    ) -> EventRecord:
        """The record of ``message``, event ``seq`` of ``stream``."""
        if message is None:
            return cls(seq, stream, request_id=request_id, replica=replica)
        wire = message.model_dump_json(by_alias=True, exclude_unset=True)
        return cls(seq, stream, type(message).__name__, wire, request_id, replica)

    @classmethod
    def end(cls, seq: int, stream: StreamId, request_id: str | int, message: str, replica: str) -> EventRecord:
        """The record that ends a request's stream at ``seq`` with a JSON-RPC error: its terminal record."""
        return cls.of(seq, stream, error(request_id, message), request_id, replica)

    @property
    def final(self) -> bool:
        """True for a response or an error: the last event of a request's stream."""
        return self.kind in _FINAL_KINDS

    def decode(self) -> JSONRPCMessage | None:
        """The message (None for a priming event); a ValueError if it does not validate."""
        if self.kind is None or self.message is None:
            return None
        return _MESSAGE_TYPES[self.kind].model_validate_json(self.message)

    def to_json(self) -> dict[str, Any]:
        """The record as stored (the keys of absent fields left out, ``message`` always there)."""
        data: dict[str, Any] = {"seq": self.seq, "stream": self.stream, "message": self.message}
        if self.kind is not None:
            data["kind"] = self.kind
        if self.request_id is not None:
            data["id"] = self.request_id
        if self.replica is not None:
            data["replica"] = self.replica
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EventRecord:
        """The record stored as ``data``; EventRecordError for another layout version or a corrupt one."""
        version = data.get("v", 1)
        if version != RECORD_VERSION:
            raise EventRecordError(f"event record of layout version {version!r}; this kvstores reads {RECORD_VERSION}")
        seq, stream, kind, message = data.get("seq"), data.get("stream"), data.get("kind"), data.get("message")
        request_id, replica = data.get("id"), data.get("replica")
        if (
            not _is_int(seq)
            or not isinstance(stream, str)
            or (kind is None) != (message is None)
            or not (kind is None or kind in _MESSAGE_TYPES)
            or not (message is None or isinstance(message, str))
            or not (request_id is None or isinstance(request_id, str) or _is_int(request_id))
            or not (replica is None or isinstance(replica, str))
        ):
            raise EventRecordError(f"corrupt event record: {sorted(data)}")
        return cls(seq, stream, kind, message, request_id, replica)


Entries = list[EventRecord | None]
"""A window of a ring, from some sequence number on: None where nothing (readable) is stored."""


class Ring:
    """The event store's calls on its store: write an event, read a window of a ring, write and read ends."""

    def __init__(
        self, store: AsyncKeyValue, collection: str, timeout: float | None, max_events: int, ttl: float
    ) -> None:
        self.store, self.collection, self.timeout = store, collection, timeout
        self.max_events, self.ttl = max_events, ttl
        self.failing = False
        """True from a failed store call to the next one that returns."""

    def key(self, token: str, seq: int) -> str:
        """Where event ``seq`` of the stream ``token`` lives: its slot of the ring."""
        return f"{token}:{seq % self.max_events}"

    async def write(self, token: str, record: EventRecord) -> bool:
        """Put one event; log a failure instead of raising it. True if the store kept it."""
        try:
            with self.deadline():
                await self.store.put(
                    self.key(token, record.seq), record.to_json(), collection=self.collection, ttl=self.ttl
                )
        except Exception as exc:
            self.failed("store an event", exc)
            return False
        self.answered()
        return True

    async def read(
        self, token: str, start: int, count: int, *others: str
    ) -> tuple[Entries, EventRecord | None, list[Any]]:
        """One round trip: ``count`` ring entries from ``start`` on (as stored: :func:`ended` applies the end),
        the stream's end record, and the values of the keys ``others``. Raises what the store raised,
        EventRecordError for a record that cannot be read."""
        keys = [self.key(token, seq) for seq in range(start, start + count)] + [end_key(token), *others]
        with self.deadline():
            values = await self.store.get_many(keys, collection=self.collection)
        entries = [_record(value) for value in values[:count]]
        return entries, _record(values[count]), values[count + 1 :]

    async def record_end(self, token: str, end: EventRecord, within: float | None) -> bool | None:
        """Write ``end`` as the stream's end unless one is there (compare-and-set): True if written,
        False if another process's end was there first, None if the store did not take it (logged)."""
        key, value = end_key(token), end.to_json()
        try:
            with nullcontext() if within is None else anyio.fail_after(within):
                if isinstance(self.store, AtomicStore):
                    return await self.store.put_if_absent(key, value, collection=self.collection, ttl=self.ttl)
                await self.store.put(key, value, collection=self.collection, ttl=self.ttl)
                return True
        except Exception as exc:
            logger.warning("event store could not record the end of a request (%r)", exc)
            return None

    async def ended_streams(self, tokens: Sequence[str]) -> list[str]:
        """The streams among ``tokens`` that have an end record (one round trip; raises what the store raised)."""
        with self.deadline():
            ends = await self.store.get_many([end_key(token) for token in tokens], collection=self.collection)
        return [token for token, end in zip(tokens, ends) if end is not None]

    def deadline(self) -> AbstractContextManager[object]:
        """A scope that gives up a store call after ``timeout`` seconds (None: the store's own timeout)."""
        return nullcontext() if self.timeout is None else anyio.fail_after(self.timeout)

    def failed(self, action: str, exc: Exception) -> None:
        """Log that the store could not ``action``: a warning once per outage, then debug messages."""
        level = logging.DEBUG if self.failing else logging.WARNING
        self.failing = True
        logger.log(level, "event store could not %s (%r); streams stay live but cannot resume", action, exc)

    def answered(self) -> None:
        """A store call returned: the outage, if any, is over."""
        if self.failing:
            self.failing = False
            logger.info("event store answers again; new events are resumable")


def end_key(token: str) -> str:
    """Where a request stream's terminal record lives: beside its ring (``<token>:<n>``), never one of its slots."""
    return f"{token}:end"


def presence_key(replica: str) -> str:
    """Where a live replica's lease lives."""
    return f"replica:{replica}"


def ended(entries: Entries, start: int, end: EventRecord | None) -> Entries:
    """``entries`` (read from sequence number ``start`` on) as the stream's terminal record ``end`` leaves them:
    the record in its place, nothing after it, whatever the runner stored there."""
    if end is None or not start <= end.seq < start + len(entries):
        return entries
    cut = end.seq - start
    return [*entries[:cut], end, *[None] * (len(entries) - cut - 1)]


def is_get_stream(stream_id: StreamId) -> bool:
    """True for the SDK's standalone GET stream (also under a session's prefix): it carries no request."""
    return stream_id == GET_STREAM_KEY or stream_id.endswith(":" + GET_STREAM_KEY)


def request_id_of(stream_id: StreamId) -> int | str:
    """The JSON-RPC id of the request whose stream this is (the SDK names a request's stream ``str(id)``)."""
    return int(stream_id) if re.fullmatch(r"-?[0-9]{1,18}", stream_id) else stream_id


def error(request_id: int | str, message: str) -> JSONRPCError:
    """The JSON-RPC internal error ``message`` answering the request ``request_id``."""
    return JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=INTERNAL_ERROR, message=message))


def _record(value: Mapping[str, Any] | None) -> EventRecord | None:
    return None if value is None else EventRecord.from_json(value)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
