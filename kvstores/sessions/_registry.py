"""The session registry of durable sessions: one record per session on a kvstores store.

It needs no MCP package (:mod:`kvstores.sessions._http` is the SDK and FastMCP glue): a record
holds the session's id, created and last-seen times, a terminated flag, the negotiated
protocol version, the client's ``initialize`` params and its creator's authorization context,
in the collection :data:`REGISTRY_COLLECTION`, keyed by session id, expiring ``idle_ttl`` after
its last refresh. Records carry a layout version; one that cannot be read raises
:class:`SessionRecordError`. Sessions are named in logs and errors by :func:`label`, never by id.

:func:`label`, :func:`digest` and :func:`scrubbed` are the package's own helpers (not exported by
:mod:`kvstores.sessions`).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from kvstores._codec import MAX_TTL_SECONDS
from kvstores.errors import DeserializationError
from kvstores.protocol import AtomicStore, missing_methods

if TYPE_CHECKING:
    from kvstores.protocol import AsyncKeyValue

__all__ = [
    "DEFAULT_IDLE_TTL",
    "MAX_REFRESH_INTERVAL",
    "RECORD_VERSION",
    "REGISTRY_COLLECTION",
    "SessionRecord",
    "SessionRecordError",
    "SessionRegistry",
]

DEFAULT_IDLE_TTL = 86_400.0
"""Seconds a session stays adoptable after its last request (one day, like FastMCP's state)."""

REGISTRY_COLLECTION = "kvstores-sessions"
"""The collection that holds the session records."""

RECORD_VERSION = 1
"""The layout version of the records this kvstores writes and reads."""

MAX_REFRESH_INTERVAL = 30.0
"""Upper bound of the seconds between two registry refreshes of a session in use."""

_MAX_IDLE_TTL = MAX_TTL_SECONDS - MAX_REFRESH_INTERVAL

_READ_BATCH = 500
"""Session records read per round trip by :meth:`SessionRegistry.ended`."""


def label(session_id: str) -> str:
    """How kvstores names a session in logs and errors: never the id itself, a bearer-like secret.

    The first 12 hex digits of the id's SHA-256: an operator holding the id finds its lines, a
    reader of the logs cannot use them (nor inject anything through a hostile id).
    """
    return "#" + hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def digest(session_id: str) -> str:
    """How a termination signal names a session: the id's SHA-256 (a signal is no place for a secret)."""
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()


def scrubbed(exc: BaseException, session_id: str) -> str:
    """``exc`` as one log line, the session id it may name (a store error names its key) replaced by its label."""
    return f"{type(exc).__name__}: {exc}".replace(session_id, label(session_id))


class SessionRecordError(DeserializationError):
    """A session record that cannot be read: corrupt, or written by another kvstores version."""


@dataclass(frozen=True)
class SessionRecord:
    """What the registry knows of one session."""

    session_id: str
    created: float
    """Wall-clock time the session was opened (seconds since the epoch)."""
    seen: float
    """Wall-clock time of its last refresh."""
    terminated: bool
    """True once a client ended it with DELETE: the id is refused everywhere."""
    protocol_version: str | None
    """The protocol version negotiated by its ``initialize``."""
    handshake: dict[str, Any] | None
    """The client's ``initialize`` params (protocol version, capabilities, client info)."""
    owner: dict[str, Any] | None
    """The creator's authorization context (client_id, issuer, subject); None without auth."""
    shared: bool = True
    """True once a process other than its creator adopted it (a DELETE then waits out the others' reads;
    see :mod:`kvstores.sessions._terminations`). A record without the field, written by an older
    kvstores or rewritten by one, counts as shared."""

    def to_json(self) -> dict[str, Any]:
        """The stored form of the record."""
        return {
            "v": RECORD_VERSION,
            "session_id": self.session_id,
            "created": self.created,
            "seen": self.seen,
            "terminated": self.terminated,
            "protocol_version": self.protocol_version,
            "handshake": self.handshake,
            "owner": self.owner,
            "shared": self.shared,
        }

    @classmethod
    def from_json(cls, session_id: str, stored: Mapping[str, Any]) -> SessionRecord:
        """Read a stored record; raise SessionRecordError when it is not a record this version wrote."""
        version = stored.get("v")
        if version != RECORD_VERSION:
            raise SessionRecordError(
                f"session record {label(session_id)} has layout version {version!r}; this kvstores reads "
                f"version {RECORD_VERSION} (was it written by another kvstores version?)"
            )
        try:
            record = cls(
                session_id=_typed(stored, "session_id", str),
                created=float(_typed(stored, "created", (int, float))),
                seen=float(_typed(stored, "seen", (int, float))),
                terminated=_typed(stored, "terminated", bool),
                protocol_version=_typed(stored, "protocol_version", (str, type(None))),
                handshake=_typed(stored, "handshake", (dict, type(None))),
                owner=_typed(stored, "owner", (dict, type(None))),
                shared=_typed(stored, "shared", bool) if "shared" in stored else True,
            )
        except (KeyError, TypeError) as exc:
            raise SessionRecordError(f"session record {label(session_id)} is corrupt: {exc}") from exc
        if record.session_id != session_id:
            raise SessionRecordError(
                f"session record {label(session_id)} is corrupt: it names {label(record.session_id)}"
            )
        return record


def _typed(stored: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = stored[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise TypeError(f"field {name!r} is {type(value).__name__}")
    return value


class SessionRegistry:
    """Session records on a kvstores store, one per session id, expiring ``idle_ttl`` after their last refresh."""

    def __init__(
        self,
        store: AsyncKeyValue,
        *,
        idle_ttl: float = DEFAULT_IDLE_TTL,
        collection: str = REGISTRY_COLLECTION,
    ) -> None:
        if lacks := missing_methods(store, AtomicStore):
            raise TypeError(
                f"durable sessions need a store with atomic operations (kvstores.AtomicStore); "
                f"{type(store).__name__} has no {', '.join(f'{name}()' for name in lacks)}"
            )
        if isinstance(idle_ttl, bool) or not isinstance(idle_ttl, (int, float)) or not math.isfinite(idle_ttl):
            raise ValueError(f"idle_ttl must be a finite number of seconds, not {idle_ttl!r}")
        if not 0 < idle_ttl <= _MAX_IDLE_TTL:  # a record lives idle_ttl + refresh_interval: a TTL every store takes
            raise ValueError(f"idle_ttl must be > 0 and <= {_MAX_IDLE_TTL:g} seconds, not {idle_ttl!r}")
        self.store = store
        self.collection = collection
        self.idle_ttl = float(idle_ttl)
        self.refresh_interval = min(self.idle_ttl / 4, MAX_REFRESH_INTERVAL)
        """Seconds between two refreshes of a session in use."""
        self.record_ttl = self.idle_ttl + self.refresh_interval
        """The TTL each write gives a record."""

    @property
    def _atomic(self) -> AtomicStore:
        return cast(AtomicStore, self.store)

    async def register(
        self,
        session_id: str,
        *,
        owner: Mapping[str, Any] | None,
        handshake: Mapping[str, Any] | None,
        protocol_version: str | None,
    ) -> bool:
        """Record a new session; False (and nothing written) when its id is already recorded.

        ``protocol_version`` is the one negotiated for ``handshake`` (the SDK's to decide).
        """
        now = time.time()
        record = SessionRecord(
            session_id=session_id,
            created=now,
            seen=now,
            terminated=False,
            protocol_version=protocol_version,
            handshake=None if handshake is None else dict(handshake),
            owner=None if owner is None else dict(owner),
            shared=False,
        )
        return await self._atomic.put_if_absent(
            session_id, record.to_json(), collection=self.collection, ttl=self.record_ttl
        )

    async def get(self, session_id: str) -> SessionRecord | None:
        """The record of ``session_id``, None when there is none (never registered, or expired)."""
        with _readable(session_id):
            stored = await self.store.get(session_id, collection=self.collection)
        return None if stored is None else SessionRecord.from_json(session_id, stored)

    async def touch(self, session_id: str, *, adopted: bool = False) -> SessionRecord | None:
        """Push back the expiry of a live record; return the record as it now is (None when absent).

        A terminated record is returned as it is, never revived. ``adopted``: the caller is a
        process that did not create the session, now serving it (the record becomes shared).
        """
        now = time.time()

        def refreshed(old: dict[str, Any] | None) -> dict[str, Any] | None:
            if old is None:
                return None
            record = SessionRecord.from_json(session_id, old)
            if record.terminated:
                return old
            return replace(record, seen=now, shared=record.shared or adopted).to_json()

        with _readable(session_id):
            stored = await self._atomic.update(session_id, refreshed, collection=self.collection, ttl=self.record_ttl)
        return None if stored is None else SessionRecord.from_json(session_id, stored)

    async def ended(self, session_ids: Sequence[str]) -> set[str]:
        """Those of ``session_ids`` whose record is terminated or gone (one ``get_many`` per 500 ids).

        An unreadable record is not counted: the session's next request reads it and answers 500.
        """
        ended: set[str] = set()
        for start in range(0, len(session_ids), _READ_BATCH):
            batch = session_ids[start : start + _READ_BATCH]
            for session_id, stored in zip(batch, await self.store.get_many(batch, collection=self.collection)):
                try:
                    if stored is None or SessionRecord.from_json(session_id, stored).terminated:
                        ended.add(session_id)
                except SessionRecordError:
                    continue
        return ended

    async def terminate(self, session_id: str) -> bool:
        """Mark ``session_id`` terminated (a tombstone that lives ``record_ttl``), whatever was recorded.

        Returns whether the session was shared as the tombstone replaced it (True when that is
        not known: no record, or one that could not be read).
        """
        now = time.time()
        shared = True

        def tombstone(old: dict[str, Any] | None) -> dict[str, Any]:
            nonlocal shared
            try:
                record = None if old is None else SessionRecord.from_json(session_id, old)
            except SessionRecordError:
                record = None  # an unreadable record is replaced: the client's DELETE wins
            shared = record is None or record.shared
            if record is None:
                record = SessionRecord(session_id, now, now, True, None, None, None)
            return replace(record, terminated=True, seen=now).to_json()

        try:
            await self._atomic.update(session_id, tombstone, collection=self.collection, ttl=self.record_ttl)
        except DeserializationError:
            # The stored bytes do not even decode: overwrite them with a fresh tombstone.
            await self.store.put(session_id, tombstone(None), collection=self.collection, ttl=self.record_ttl)
        return shared


@contextlib.contextmanager
def _readable(session_id: str) -> Iterator[None]:
    """Turn the store's DeserializationError about a record into a SessionRecordError naming the session."""
    try:
        yield
    except SessionRecordError:
        raise
    except DeserializationError as exc:
        raise SessionRecordError(f"session record {label(session_id)} is corrupt: {scrubbed(exc, session_id)}") from exc
