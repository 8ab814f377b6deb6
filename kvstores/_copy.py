"""The engine of ``kvstores copy``: every live entry of one store into another, keeping TTLs.

It streams one collection at a time: it lists the collection's keys (``keys()`` returns them
all at once on every kvstores backend, and the protocol has no cursor, so the key names of
the largest collection are the one thing held in full), then reads the entries with
``ttl_many`` in chunks of :data:`CHUNK` and writes each chunk with ``put_many``, one call per
remaining TTL rounded to the millisecond, a few calls in flight at once. So memory is bounded
by the key names of one collection plus one chunk of values, whatever the size of the store.
An entry the source cannot read or DEST rejects is counted and reported, never fatal; a lost
backend stops the copy (:func:`is_outage`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvstores.base import BaseStore, chunks

__all__ = ["CHUNK", "Copy", "Progress", "Tally", "is_outage"]

CHUNK = 1_000
"""Keys per ``ttl_many`` call on the source of ``copy`` (and of ``ls``)."""

_WRITES_IN_FLIGHT = 8  # put_many calls of one chunk running at once
_UNREADABLE: Any = object()  # in place of the value of an entry the source could not read


class Progress(Protocol):
    """What shows a copy's progress (a bar on a terminal, nothing elsewhere)."""

    def start(self, collection: str, total: int) -> None:
        """A collection of ``total`` keys begins."""

    def advance(self, count: int) -> None:
        """``count`` more entries of the current collection handled."""

    def stop(self) -> None:
        """The copy ended."""


@dataclass
class Tally:
    """What a copy did so far."""

    copied: int = 0
    collections: int = 0
    expired: int = 0
    existing: int = 0
    failures: list[str] = field(default_factory=list)

    def fail(self, collection: str, key: str, exc: BaseException) -> None:
        """Record an entry that could not be copied, and why."""
        self.failures.append(f"collection {collection!r} key {key!r}: {type(exc).__name__}: {exc}")

    def summary(self, dry_run: bool) -> str:
        """The one-line summary."""
        skipped = self.expired + self.existing
        line = f"{'would copy' if dry_run else 'copied'} {self.copied} entries in {self.collections} collections"
        line += f", skipped {skipped}"
        if skipped:
            line += f" ({self.expired} expired, {self.existing} already in DEST)"
        if self.failures:
            line += f", failed {len(self.failures)}"
        return line + (" (dry run: nothing written)" if dry_run else "")


def _rounded(ttl: float | None) -> float | None:
    """A TTL to the millisecond (None: never expires); at most 0 once expired.

    Milliseconds, not whole seconds: every backend keeps them, and a TTL rounded to seconds
    drifts by up to half a second on each copy. Entries written together (one put_many)
    share an expiry and so, read together, one rounded TTL and one put_many call.
    """
    return None if ttl is None else round(ttl, 3)


@dataclass
class Copy:
    """One ``kvstores copy`` run: SOURCE and DEST stores and what to do."""

    source: Any
    dest: Any
    no_overwrite: bool
    dry_run: bool
    tally: Tally = field(default_factory=Tally)

    async def collection(self, collection: str, progress: Progress) -> None:
        """Copy one collection, a chunk at a time."""
        keys = await self.source.keys(collection)
        if not isinstance(self.source, BaseStore) and len(keys) >= 1_000 and len(keys) % 1_000 == 0:
            # py-key-value stores cap keys() at a page (10,000 for most) and offer no cursor
            self.tally.failures.append(
                f"collection {collection!r}: the source listed exactly {len(keys)} keys, "
                "possibly a page limit of the store: entries beyond it may not have been copied"
            )
        self.tally.collections += 1
        progress.start(collection, len(keys))
        for chunk in chunks(keys, CHUNK):
            read_at = time.monotonic()
            entries = await self._read(collection, chunk)
            read_at = (read_at + time.monotonic()) / 2  # the TTLs were read around then
            if self.no_overwrite and entries:
                present = await self.dest.get_many([key for key, _, _ in entries], collection=collection)
                kept = [entry for entry, there in zip(entries, present) if there is None]
                self.tally.existing += len(entries) - len(kept)
                entries = kept
            if self.dry_run:
                self.tally.copied += len(entries)
            else:
                await self._write(collection, entries, read_at)
            progress.advance(len(chunk))

    async def _read(self, collection: str, keys: Sequence[str]) -> list[tuple[str, dict[str, Any], float | None]]:
        """The live entries of ``keys``: (key, value, remaining TTL)."""
        try:
            rows = await self.source.ttl_many(list(keys), collection=collection)
        except Exception as exc:  # an undecodable or invalid entry: find which, one at a time
            if is_outage(exc):
                raise
            rows = [await self._read_one(collection, key) for key in keys]
        entries = []
        for key, (value, ttl) in zip(keys, rows):
            if value is None:
                self.tally.expired += 1
            elif value is not _UNREADABLE:
                entries.append((key, value, ttl))
        return entries

    async def _read_one(self, collection: str, key: str) -> tuple[Any, float | None]:
        try:
            value, ttl = await self.source.ttl(key, collection=collection)
        except Exception as exc:
            if is_outage(exc):
                raise
            self.tally.fail(collection, key, exc)
            return _UNREADABLE, None
        return value, ttl

    async def _write(
        self, collection: str, entries: list[tuple[str, dict[str, Any], float | None]], read_at: float
    ) -> None:
        """Write ``entries`` (read at monotonic time ``read_at``): one put_many per TTL, a few at once."""
        groups: dict[float | None, list[tuple[str, dict[str, Any]]]] = {}
        for key, value, ttl in entries:
            groups.setdefault(_rounded(ttl), []).append((key, value))
        gate = asyncio.Semaphore(_WRITES_IN_FLIGHT)

        async def put(ttl: float | None, group: list[tuple[str, dict[str, Any]]]) -> None:
            async with gate:
                # the time since the read is taken off, so that the copy expires when the original does
                left = None if ttl is None else _rounded(ttl - (time.monotonic() - read_at))
                if left is not None and left <= 0:
                    self.tally.expired += len(group)
                else:
                    await self._put_group(collection, left, group)

        await asyncio.gather(*(put(ttl, group) for ttl, group in groups.items()))

    async def _put_group(self, collection: str, ttl: float | None, group: list[tuple[str, dict[str, Any]]]) -> None:
        try:
            await self.dest.put_many(
                [key for key, _ in group], [value for _, value in group], collection=collection, ttl=ttl
            )
            self.tally.copied += len(group)
            return
        except Exception as exc:  # put_many validates first and writes nothing: find the entries DEST rejects
            if is_outage(exc):
                raise
        for key, value in group:
            try:
                await self.dest.put(key, value, collection=collection, ttl=ttl)
            except Exception as exc:
                if is_outage(exc):
                    raise
                self.tally.fail(collection, key, exc)
            else:
                self.tally.copied += 1


def is_outage(exc: BaseException) -> bool:
    """True for a lost or unreachable backend (kvstores' and py-key-value's connection errors)."""
    return isinstance(exc, (ConnectionError, OSError, TimeoutError)) or "Connection" in type(exc).__name__
