"""What the page shows, sampled at most once per interval however many people look.

A sample is one step of each census (:mod:`kvstores.dashboard._census`: one page of tasks, one
of sessions, one of event keys), one timed ``put`` and ``get`` of a probe entry, and one round
trip on the store's signal channel (published here, received back here). Samples are kept in
bounded rings (:data:`HISTORY` of them) for the charts; every viewer's poll is served from the
last sample, so the store's load does not grow with the number of open pages.

The probe entry is the dashboard's one write besides a cancel: ``probe/<this process>`` in the
collection :data:`PROBE_COLLECTION`, expiring after a minute. The signal probe publishes on a
channel name of its own.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from kvstores._urls import redact, redact_text
from kvstores.dashboard._census import EVENTS_COLLECTION, EventCensus, SessionCensus, TaskCensus
from kvstores.dashboard._tasks import Limits, TaskView
from kvstores.errors import KVStoreError
from kvstores.sessions._registry import REGISTRY_COLLECTION

__all__ = ["HISTORY", "PROBE_COLLECTION", "Collector"]

HISTORY = 300
"""Samples kept for the charts (ten minutes at the default interval)."""

PROBE_COLLECTION = "kvstores-dashboard"
"""Where the latency probe writes its one entry."""

_SIGNAL_WAIT = 2.0
_ERROR_LINE = 300


def _kvstores_version() -> str:
    try:
        return version("kvstores")
    except PackageNotFoundError:
        return "unknown"


class Collector:
    """The store's state as the dashboard shows it: :meth:`snapshot`, sampled at most every ``interval`` s."""

    def __init__(
        self,
        store: Any,
        *,
        url: str | None = None,
        interval: float = 2.0,
        page: int = 500,
        limits: Limits | None = None,
        sessions_collection: str = REGISTRY_COLLECTION,
        events_collection: str = EVENTS_COLLECTION,
    ) -> None:
        self.store = store
        self.url = url
        self.interval = interval
        self.tasks = TaskView(store, limits or Limits(), fresh_for=interval)
        self.task_census = TaskCensus(self.tasks.engine, self.tasks.attempts, self.tasks.limits, page)
        self.session_census = SessionCensus(store, page, sessions_collection)
        self.event_census = EventCensus(store, page, events_collection)
        self.series: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self.latest: dict[str, Any] | None = None
        self._sampled = 0.0
        self._lock = asyncio.Lock()
        self._probe_key = f"probe/{secrets.token_hex(4)}"
        self._signal_name = f"kvstores-dashboard/{secrets.token_hex(8)}"
        self._unsubscribe: Callable[[], None] | None = None
        self._arrived: dict[str, asyncio.Future[float]] = {}

    async def snapshot(self) -> dict[str, Any]:
        """The last sample, taken anew when it is older than the interval (concurrent callers share one)."""
        async with self._lock:
            if self.latest is None or time.monotonic() - self._sampled >= self.interval:
                self.latest = await self._sample()
                self._sampled = time.monotonic()
            return self.latest

    async def aclose(self) -> None:
        """Stop listening on the signal channel (the store, which the caller owns, stays open)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    async def _sample(self) -> dict[str, Any]:
        now = time.time()
        started = time.monotonic()
        point: dict[str, Any] = {"t": now}
        section: dict[str, Any] = {}
        errors: list[str] = []
        steps: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
            "tasks": lambda: self.task_census.step(now),
            "sessions": lambda: self.session_census.step(now),
            "events": self.event_census.step,
        }
        for name, step in steps.items():
            try:
                section[name] = await step()
            except Exception as exc:  # shown on the page (redacted), the others still sampled
                section[name] = None
                # a session store's error may name its key, a session id: the type alone is shown for it
                errors.append(f"{name}: {type(exc).__name__ if name == 'sessions' else _line(exc, self.url)}")
        get_ms, put_ms, probe_error = await self._latency()
        if probe_error:
            errors.append(probe_error)
        signal_ms = await self._signal_round_trip()
        point.update(get=get_ms, put=put_ms, signal=signal_ms)
        if section["tasks"] is not None:
            point["states"] = section["tasks"]["states"]
        if section["events"] is not None:
            point["events"] = section["events"]["events"]
            point["streams"] = section["events"]["streams"]
        self.series.append(point)
        return {
            "now": now,
            "interval": self.interval,
            "store": self._store_facts(),
            "tasks": section["tasks"],
            "sessions": section["sessions"],
            "events": section["events"],
            "series": list(self.series),
            "errors": errors,
            "sample_ms": round((time.monotonic() - started) * 1000, 1),
        }

    def _store_facts(self) -> dict[str, Any]:
        key_ids = list(getattr(self.store, "encryption_key_ids", ()) or ())
        return {
            "backend": type(self.store).__name__,
            "url": None if self.url is None else redact(self.url),
            "kvstores": _kvstores_version(),
            "encryption": bool(key_ids),
            "key_ids": key_ids,
        }

    async def _latency(self) -> tuple[float | None, float | None, str | None]:
        """Milliseconds of one put and one get of the probe entry (None: failed), and the failure."""
        try:
            started = time.perf_counter()
            await self.store.put(self._probe_key, {"at": time.time()}, collection=PROBE_COLLECTION, ttl=60)
            put_ms = (time.perf_counter() - started) * 1000
            started = time.perf_counter()
            await self.store.get(self._probe_key, collection=PROBE_COLLECTION)
            get_ms = (time.perf_counter() - started) * 1000
        except Exception as exc:
            return None, None, f"probe: {_line(exc, self.url)}"
        return round(get_ms, 2), round(put_ms, 2), None

    async def _signal_round_trip(self) -> float | None:
        """Milliseconds from publishing on the store's signal channel to receiving it back (None: lost or none)."""
        from kvstores.signals import channel

        try:
            signals = channel(self.store)
            if self._unsubscribe is None:
                self._unsubscribe = await signals.listen(self._signal_name, self._arrive)
            message = secrets.token_hex(6)
            arrived = asyncio.get_running_loop().create_future()
            self._arrived[message] = arrived
            try:
                started = time.perf_counter()
                await signals.publish(self._signal_name, message)
                received: float = await asyncio.wait_for(arrived, _SIGNAL_WAIT)
            finally:
                self._arrived.pop(message, None)
        except (KVStoreError, TypeError, ValueError, OSError, TimeoutError):
            return None
        return round((received - started) * 1000, 2)

    def _arrive(self, message: str) -> None:
        arrived = self._arrived.get(message)
        if arrived is not None and not arrived.done():
            arrived.set_result(time.perf_counter())


def _line(exc: BaseException, url: str | None) -> str:
    """``exc`` as one short line without credentials (and without the text of a record-level error)."""
    text = redact_text(f"{type(exc).__name__}: {exc}", *([url] if url else []))
    text = " ".join(text.split())
    return text if len(text) <= _ERROR_LINE else text[: _ERROR_LINE - 3] + "..."
