"""Rolling counts of a store's tasks, sessions and event streams, one bounded page per step.

Each census walks its collection with ``keys(collection, limit=page, after=cursor)``: one step
reads one page (and, for records, one ``get_many`` of it) and moves the cursor on; when a page
comes back short the sweep is complete, its totals become the published counts, and the next
step starts over. A store that fits in one page is counted exactly at every step; a larger one
is counted over ``ceil(entries / page)`` steps, its published counts at most one sweep old.
Nothing here ever reads a whole collection at once, nor a value it does not need (the event
census reads keys only), and nothing it publishes names a session id or a stream token.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any, cast

from kvstores.dashboard._tasks import Attempts, Limits, read_records, row, sealed_key_id
from kvstores.errors import DeserializationError, EncryptionKeyError
from kvstores.protocol import EnumerateKeysStore
from kvstores.sessions._registry import REGISTRY_COLLECTION, SessionRecord, SessionRecordError
from kvstores.tasks._book import RECORDS
from kvstores.tasks._engine import TaskEngine
from kvstores.tasks._record import TaskState

__all__ = ["EVENTS_COLLECTION", "EventCensus", "SessionCensus", "Sweep", "TaskCensus"]

EVENTS_COLLECTION = "kvstores_events"
"""StoreEventStore's default collection (``kvstores.events.EVENTS_COLLECTION``, which needs the mcp extra)."""

_STUCK_SHOWN = 25
_LARGEST_SHOWN = 10
_IDLE = ((60, "< 1 min"), (600, "< 10 min"), (3_600, "< 1 h"), (86_400, "< 1 day"))


class Sweep:
    """A cursor over one collection's keys, one page per step, starting over after the last page."""

    def __init__(self, store: Any, collection: str, page: int) -> None:
        self.store = cast(EnumerateKeysStore, store)
        self.collection = collection
        self.page = page
        self.cursor: str | None = None

    async def step(self) -> tuple[list[str], bool]:
        """The next page of keys, and whether it ends the sweep."""
        keys = await self.store.keys(self.collection, limit=self.page, after=self.cursor)
        done = len(keys) < self.page
        self.cursor = None if done else keys[-1]
        return keys, done


class _Rolling:
    """Counts gathered over a sweep (``partial``) and those of the last complete sweep (``published``)."""

    published: dict[str, Any] | None
    partial: dict[str, Any]

    def __init__(self) -> None:
        self.published = None
        self.partial = self._empty()

    @staticmethod
    def _empty() -> dict[str, Any]:
        raise NotImplementedError

    def _shown(self, done: bool) -> dict[str, Any]:
        """The counts to show after a step: the sweep's once it is ``done`` (and a new one begins), else
        the last complete sweep's, else the partial counts of the first."""
        if done:
            self.published, self.partial = self.partial, self._empty()
        return self.published or self.partial


class TaskCensus(_Rolling):
    """Tasks by state and tool, the stuck ones, and those this dashboard's keys cannot open."""

    def __init__(self, engine: TaskEngine, attempts: Attempts, limits: Limits, page: int) -> None:
        self.engine = engine
        self.attempts = attempts
        self.limits = limits
        self.sweep = Sweep(engine.store, RECORDS, page)
        super().__init__()

    @staticmethod
    def _empty() -> dict[str, Any]:
        return {"states": Counter[str](), "tools": Counter[str](), "stuck": [], "sealed": Counter[str](), "total": 0}

    async def step(self, now: float) -> dict[str, Any]:
        """Count one more page; the counts as published (the last whole sweep, or this first one so far)."""
        keys, done = await self.sweep.step()
        refs = [key for key in keys if "/" not in key]
        counts = self.partial
        for read in await read_records(self.engine, refs) if refs else []:
            counts["total"] += 1
            if read.record is None:
                counts["states"]["sealed" if read.sealed else "unreadable"] += 1
                if read.sealed:
                    counts["sealed"][read.sealed] += 1
                continue
            self.attempts.observe(read.record, now)
            counts["states"][read.record.state.value] += 1
            counts["tools"][read.record.tool] += 1
            line = row(read, now, self.limits)
            if line["stuck"] and len(counts["stuck"]) < _STUCK_SHOWN:
                counts["stuck"].append(line)
        shown = self._shown(done)
        return {
            "complete": self.published is not None,
            "total": shown["total"],
            "states": {state.value: shown["states"].get(state.value, 0) for state in TaskState}
            | {name: n for name, n in shown["states"].items() if name not in TaskState.__members__.values()},
            "tools": dict(shown["tools"].most_common(50)),
            "stuck": shown["stuck"],
            "sealed": dict(shown["sealed"]),
        }


class SessionCensus(_Rolling):
    """Durable sessions (:mod:`kvstores.sessions`): live and terminated, idle times, clients; never an id."""

    def __init__(self, store: Any, page: int, collection: str = REGISTRY_COLLECTION) -> None:
        self.store = store
        self.sweep = Sweep(store, collection, page)
        super().__init__()

    @staticmethod
    def _empty() -> dict[str, Any]:
        return {"live": 0, "terminated": 0, "idle": Counter[str](), "clients": Counter[str](), "sealed": Counter[str]()}

    async def step(self, now: float) -> dict[str, Any]:
        """Count one more page of session records; the counts as published."""
        ids, done = await self.sweep.step()
        counts = self.partial
        for stored, failure in await self._values(ids):
            if failure is not None:
                counts["sealed"][failure] += 1
                continue
            if stored is None:
                continue
            record = stored
            if record.terminated:
                counts["terminated"] += 1
                continue
            counts["live"] += 1
            counts["idle"][_idle(now - record.seen)] += 1
            info = (record.handshake or {}).get("clientInfo") or {}
            name = info.get("name") if isinstance(info, dict) else None
            counts["clients"][name[:60] if isinstance(name, str) else "(unnamed)"] += 1
        shown = self._shown(done)
        return {
            "complete": self.published is not None,
            "live": shown["live"],
            "terminated": shown["terminated"],
            "idle": {name: shown["idle"].get(name, 0) for _, name in _IDLE} | {"older": shown["idle"].get("older", 0)},
            "clients": dict(shown["clients"].most_common(10)),
            "sealed": dict(shown["sealed"]),
        }

    async def _values(self, ids: list[str]) -> list[tuple[SessionRecord | None, str | None]]:
        """Each record of ``ids``, or why it cannot be read (a key id, or "unreadable"): never the id itself."""
        if not ids:
            return []
        try:
            stored = await self.store.get_many(ids, collection=self.sweep.collection)
        except DeserializationError:  # a sealed or corrupt one fails the batch: read them one by one
            return [await self._one(session_id) for session_id in ids]
        return [_session(session_id, value) for session_id, value in zip(ids, stored, strict=True)]

    async def _one(self, session_id: str) -> tuple[SessionRecord | None, str | None]:
        try:
            value = await self.store.get(session_id, collection=self.sweep.collection)
        except EncryptionKeyError as exc:
            return None, sealed_key_id(exc)
        except DeserializationError:
            return None, "unreadable"
        return _session(session_id, value)


def _session(session_id: str, value: dict[str, Any] | None) -> tuple[SessionRecord | None, str | None]:
    if value is None:
        return None, None
    try:
        return SessionRecord.from_json(session_id, value), None
    except SessionRecordError:
        return None, "unreadable"


def _idle(seconds: float) -> str:
    return next((name for limit, name in _IDLE if seconds < limit), "older")


class EventCensus(_Rolling):
    """StoreEventStore's streams from their keys alone: how many, their sizes, ended ones, live replicas."""

    def __init__(self, store: Any, page: int, collection: str = EVENTS_COLLECTION) -> None:
        self.sweep = Sweep(store, collection, page)
        super().__init__()

    @staticmethod
    def _empty() -> dict[str, Any]:
        return {"sizes": Counter[str](), "ended": 0, "replicas": []}

    async def step(self) -> dict[str, Any]:
        """Count one more page of keys; the counts as published."""
        keys, done = await self.sweep.step()
        counts = self.partial
        for key in keys:
            if key.startswith("replica:"):
                counts["replicas"].append(key.removeprefix("replica:")[:40])
                continue
            token, colon, position = key.rpartition(":")
            if not colon:
                continue
            if position == "end":
                counts["ended"] += 1
            else:
                counts["sizes"][_stream_label(token)] += 1
        shown = self._shown(done)
        sizes: Counter[str] = shown["sizes"]
        return {
            "complete": self.published is not None,
            "streams": len(sizes),
            "events": sum(sizes.values()),
            "ended": shown["ended"],
            "largest": [{"stream": name, "events": n} for name, n in sizes.most_common(_LARGEST_SHOWN)],
            "replicas": sorted(shown["replicas"])[:50],
        }


def _stream_label(token: str) -> str:
    """How a stream is named here: its token is part of every event id (a replay capability), so a digest."""
    return "#" + hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()[:12]
