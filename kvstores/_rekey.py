"""The engine of ``kvstores rekey``: every entry of a store sealed under its first encryption key.

One collection at a time, it lists the keys and re-seals each entry that is plaintext or sealed
under another key (:meth:`kvstores.base.BaseStore.reseal`: a compare-and-set that keeps the
TTL and never overwrites a write made meanwhile). It is resumable: what it re-sealed stays so,
and a second run skips it (an interrupted run is simply run again). An entry that cannot be
opened (sealed under a key id not given) or is not a value is reported, never fatal.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from kvstores._copy import CHUNK, Progress
from kvstores.base import BaseStore, chunks
from kvstores.errors import DeserializationError

__all__ = ["Rekey"]

_IN_FLIGHT = 16  # entries re-sealed at once


@dataclass
class Rekey:
    """Re-seals the entries of ``store`` (a kvstores store opened with encryption keys)."""

    store: BaseStore
    resealed: int = 0
    current: int = 0
    collections: int = 0
    failures: list[str] = field(default_factory=list)

    async def collection(self, name: str, progress: Progress) -> None:
        """Re-seal every live entry of collection ``name``."""
        keys = await self.store.keys(name)
        progress.start(name, len(keys))
        self.collections += 1
        for chunk in chunks(keys, CHUNK):
            for batch in chunks(chunk, _IN_FLIGHT):
                await asyncio.gather(*(self._entry(name, key) for key in batch))
                progress.advance(len(batch))

    async def _entry(self, collection: str, key: str) -> None:
        try:
            rewritten = await self.store.reseal(key, collection=collection)
        except DeserializationError as exc:  # a key id not given, altered, or not a value
            self.failures.append(f"collection {collection!r} key {key!r}: {type(exc).__name__}: {exc}")
            return
        if rewritten:
            self.resealed += 1
        else:
            self.current += 1

    def summary(self, key_id: str) -> str:
        """The one-line summary."""
        return (
            f"{self.resealed} entries re-sealed under key id {key_id!r}, {self.current} already were "
            f"(or expired meanwhile), {len(self.failures)} could not be opened, in {self.collections} collections"
        )
