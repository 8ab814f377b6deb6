"""Durable MCP sessions: a restarted process or another replica continues a handshake session.

The MCP SDK's ``StreamableHTTPSessionManager`` keeps its live sessions in a dict in process
memory. After a restart, or on a replica that did not create the session, the client's
``Mcp-Session-Id`` gets a 404, the client starts over, and everything FastMCP stored under the
old session id (``ctx.set_state``) is orphaned. :func:`http_app` serves a FastMCP server with
a session manager that records every session in a registry on a kvstores store, and adopts a
session id it does not know when the registry says the session is live::

    store = open_store("redis://localhost:6379/0")
    mcp = FastMCP("demo", session_state_store=store)
    app = kvstores.sessions.http_app(mcp, store=store, event_store=StoreEventStore(store))

What survives a restart, or a request landing on another replica:

- the session's identity: the same ``Mcp-Session-Id`` keeps working, bound to the principal
  that created it (a request with other credentials gets the SDK's own 404), with the
  protocol version, client info and capabilities of its ``initialize``;
- its state in the store: ``ctx.get_state`` reads what ``ctx.set_state`` wrote, since FastMCP
  keys state by session id and the store is shared;
- its event history, when ``event_store`` is a store every process shares (e.g.
  :class:`kvstores.events.StoreEventStore`): a client resumes a stream with ``Last-Event-ID``
  on any process. The store is scoped per session id (FastMCP's stream ids), so one
  session's events never replay to another.
- a call in progress, with a :class:`~kvstores.events.StoreEventStore` (turned ``live``
  here): a client whose stream was cut resumes on any process, which follows the call's
  events through the store as the running process stores them, to the result, exactly once
  and in order. When the running process dies, the resumed client gets a JSON-RPC error
  within its lease (:data:`kvstores.events.LEASE_TTL`) + 1 s instead.

What does not: the call a dead process was running (its client gets that error), server-to-client
requests waiting for an answer, and anything a tool kept in process memory. Nothing here applies to stateless
requests of protocol 2026-07-28 (they have no session; FastMCP's session API covers them), nor
to ``stateless_http=True`` apps, which :func:`http_app` refuses.

A session id is a bearer-like secret. A request acts in a session only with its creator's
credentials; a 2026-07-28 request, which has no session, loses any ``Mcp-Session-Id`` header
before FastMCP sees it (:class:`SessionIdGuard`, which FastMCP's own app can use too), since
FastMCP would otherwise key its state by that header. Logs and errors name a session by a
label, ``#`` and 12 hex digits of the id's SHA-256, never by the id; the SDK session
manager's log lines get the same treatment once a :class:`DurableSessionManager` exists.

The registry (:class:`SessionRegistry`) holds one small record per session in the collection
:data:`REGISTRY_COLLECTION`, keyed by session id: its id, created and last-seen times, a
terminated flag, the negotiated protocol version, the client's ``initialize`` params and the
authorization context (client id, issuer, subject) of its creator. Records carry a version
number; a record that cannot be decoded, or was written by another kvstores version, raises
:class:`SessionRecordError`, and a request for that session is answered with a 500 naming the
problem instead of crashing the process.

Costs and timing:

- A request on a session this process already serves reads its record (a ``get``) when its
  last reading began 0.25 s ago or more (``READ_WINDOW``), so that no process serves a session
  after a DELETE elsewhere has answered: the DELETE of a session that another process than its
  creator served waits out that window before it answers. Once per ``refresh_interval``
  (``idle_ttl / 4``, at most :data:`MAX_REFRESH_INTERVAL` seconds) the read is an atomic update
  instead, which pushes the record's expiry back. Opening a session costs one
  ``put_if_absent``; adopting one a read and an update; DELETE an update; an unknown session id
  one read. A registry that cannot be read leaves a held session served (logged), as in an outage.
- A record expires ``idle_ttl + refresh_interval`` seconds after its last refresh, so the
  registry holds only sessions used within about ``idle_ttl`` (default one day, like FastMCP's
  session state), and a session stays adoptable for at least ``idle_ttl`` after its last request.
- A DELETE is recorded before its response is sent, so every process refuses the session from
  then on (its next request reads the record: every earlier reading has expired). It is also
  signalled on the store's signal channel :data:`TERMINATIONS` (:mod:`kvstores.signals`; the
  message is the id's SHA-256), so that every process that holds the session closes it (its
  open streams) at once: a doorbell, never what refuses a request. After a signal GAP a process
  re-reads the records of the sessions it holds (one ``get_many`` per 500); a kvstores store
  without a signal transport re-reads them every 0.5 s instead; a foreign store (no channel at
  all) leaves it to the next request.
- Only an explicit DELETE terminates a session for good. The SDK's in-process idle timeout
  and a shutdown only drop the process's copy; the next request adopts the session again.
- Registration and refresh need :class:`kvstores.AtomicStore` (every built-in backend): a new
  record never overwrites an existing one, and a refresh never revives a terminated session.
"""

from typing import TYPE_CHECKING, Any

from kvstores.sessions._registry import (
    DEFAULT_IDLE_TTL,
    MAX_REFRESH_INTERVAL,
    RECORD_VERSION,
    REGISTRY_COLLECTION,
    SessionRecord,
    SessionRecordError,
    SessionRegistry,
)

__all__ = [
    "DEFAULT_IDLE_TTL",
    "DurableSessionManager",
    "MAX_REFRESH_INTERVAL",
    "RECORD_VERSION",
    "REGISTRY_COLLECTION",
    "SessionIdGuard",
    "SessionRecord",
    "SessionRecordError",
    "SessionRegistry",
    "TERMINATIONS",
    "http_app",
]

if TYPE_CHECKING:
    from kvstores.sessions._http import TERMINATIONS, DurableSessionManager, SessionIdGuard, http_app

_GLUE = frozenset(("TERMINATIONS", "DurableSessionManager", "SessionIdGuard", "http_app"))


def __getattr__(name: str) -> Any:
    """The SDK and FastMCP glue, imported on first use: the registry needs neither package."""
    if name in _GLUE:
        from kvstores.sessions import _http

        return getattr(_http, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
