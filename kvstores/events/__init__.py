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

The package's modules: ``_handover`` (event ids, streams in memory and the live handover, shared
by both stores), ``_memory`` (:class:`InMemoryEventStore`), ``_store`` (:class:`StoreEventStore`)
and the rooms of StoreEventStore, each with its mechanism in its docstring: ``_ring`` (the layout
in the store and its records), ``_liveness`` (a live process's lease and the requests it gives
up), ``_signals`` (how replicas wake each other) and ``_follow`` (following another replica's
stream).
"""

from kvstores._optional import missing_extra

try:
    import mcp.server.streamable_http  # noqa: F401 - the extra every module of this package needs
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("mcp", "mcp") from exc

from kvstores.events._follow import FOLLOW_POLL, UNSETTLED_MESSAGE
from kvstores.events._handover import DEFAULT_MAX_EVENTS_PER_STREAM, DEFAULT_MAX_STREAMS, DEFAULT_TTL, HANDOVER_TIMEOUT
from kvstores.events._liveness import LEASE_REFRESH, LEASE_TTL
from kvstores.events._memory import InMemoryEventStore
from kvstores.events._ring import EVENTS_COLLECTION, STOPPED_MESSAGE
from kvstores.events._signals import SIGNALS
from kvstores.events._store import DEFAULT_CACHE_EVENTS_PER_STREAM, StoreEventStore

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
    "UNSETTLED_MESSAGE",
]
