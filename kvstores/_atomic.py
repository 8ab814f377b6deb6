"""Atomic operations (:class:`kvstores.AtomicStore`) on a backend's two atomic primitives, ``_swap`` and ``_pop``.

``update()`` is optimistic and lives here once for every backend: it reads the stored text,
runs the caller's function with no lock held, then ``_swap``s in the result only if the
stored text is still the one it read (compared by the backend, atomically); a lost race
retries after a jittered exponential backoff, at most :data:`UPDATE_ATTEMPTS` times, then raises
ConflictError. The backoff's unit is the attempt's own duration (at least 1 ms): on a slow link
or a loaded server, contenders spread over several round trips instead of colliding on every
one. A function that returns :data:`kvstores.UNCHANGED` writes nothing.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, SupportsFloat

from kvstores._codec import check_key, check_ttl
from kvstores._store_core import StoreCore
from kvstores._telemetry import observed
from kvstores.errors import ConflictError
from kvstores.protocol import UNCHANGED, Unchanged

__all__ = ["UPDATE_ATTEMPTS", "AtomicOperations"]

UPDATE_ATTEMPTS = 100
"""Races ``update()`` may lose before it raises ConflictError (with backoff: about 2.5 s at most on a
fast server, 25 attempts' durations on a slow one)."""

_BACKOFF_BASE = 0.001  # seconds: the least backoff unit
_BACKOFF_CAP = 25  # units: the backoff grows to at most this many attempts' durations


class AtomicOperations(StoreCore):
    """``put_if_absent``, ``pop`` and ``update``: each one atomic step against concurrent writers."""

    @observed("key")
    async def put_if_absent(
        self,
        key: str,
        value: Mapping[str, Any],
        *,
        collection: str | None = None,
        ttl: SupportsFloat | None = None,
    ) -> bool:
        """Store ``value`` only if ``key`` has no live entry; True when it stored (one round trip)."""
        name = self._collection(collection)
        check_key(key)
        seconds = None if ttl is None else check_ttl(ttl)
        return await self._swap(name, key, None, self._sealed(self._encoded(value), name, key), seconds)

    @observed("key")
    async def pop(self, key: str, *, collection: str | None = None) -> dict[str, Any] | None:
        """Get and delete ``key`` in one atomic step (one round trip); None when absent or expired."""
        name = self._collection(collection)
        check_key(key)
        text = await self._pop(name, key)
        return None if text is None else self._decoded(text, name, key)

    @observed("key")
    async def update(
        self,
        key: str,
        fn: Callable[[dict[str, Any] | None], Mapping[str, Any] | Unchanged | None],
        *,
        collection: str | None = None,
        ttl: SupportsFloat | None = None,
    ) -> dict[str, Any] | None:
        """Atomically store ``fn(current value or None)`` with ``ttl``, or delete when it returns None.

        Returns what was stored (None after a delete). When ``fn`` returns :data:`UNCHANGED`
        nothing is written (the TTL is untouched) and the value ``fn`` was given is returned: one
        round trip. Two round trips when uncontended; ``fn`` runs with no lock held and may run again
        after a lost race, so it must have no side effects. Raises ConflictError after
        :data:`UPDATE_ATTEMPTS` lost races.
        """
        name = self._collection(collection)
        check_key(key)
        seconds = None if ttl is None else check_ttl(ttl)
        for attempt in range(UPDATE_ATTEMPTS):
            started = time.monotonic()
            stored = await self._get(name, key)
            old = None if stored is None else self._decoded(stored, name, key)
            new = fn(old)
            if new is UNCHANGED:
                return old
            if new is None and stored is None:
                return None  # nothing to delete: the entry was absent when read
            text = None if new is None else self._encoded(new)
            if await self._swap(name, key, stored, None if text is None else self._sealed(text, name, key), seconds):
                return None if text is None else self._decoded(text, name, key)  # read back from before sealing
            unit = max(_BACKOFF_BASE, time.monotonic() - started)
            await asyncio.sleep(random.uniform(0, unit * min(_BACKOFF_CAP, 2**attempt)))
        raise ConflictError(f"update of key {key!r} lost {UPDATE_ATTEMPTS} races to concurrent writers; giving up")
