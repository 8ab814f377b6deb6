"""The cost of encryption at rest: the ``encryption`` rows of the networked targets.

Contenders, interleaved, get and put of 100 B by one task: ``kvstores``, the target's URL opened
with one encryption key (a view that keeps its entries in a collection of their own, so that the
two never read each other's values; the view's extra call is charged to the sealed side), and
``without encryption``, the target's store itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvstores._sealing import generate_key
from kvstores.registry import open_store

__all__ = ["NO_ENCRYPTION", "SEALED_COLLECTION", "SealedView", "sealed_contenders"]

NO_ENCRYPTION = "without encryption"
"""Contender: the same URL's store, opened without encryption keys."""

SEALED_COLLECTION = "kvstores-bench-sealed"
"""Where the sealed contender keeps its entries."""


class SealedView:
    """``store`` (opened with a key) seen through get and put on :data:`SEALED_COLLECTION`."""

    def __init__(self, store: Any) -> None:
        self.store = store

    async def get(self, key: str, *, collection: str | None = None) -> dict[str, Any] | None:
        """The store's get, in the sealed collection."""
        value: dict[str, Any] | None = await self.store.get(key, collection=SEALED_COLLECTION)
        return value

    async def put(
        self, key: str, value: Mapping[str, Any], *, collection: str | None = None, ttl: float | None = None
    ) -> None:
        """The store's put, in the sealed collection."""
        await self.store.put(key, value, collection=SEALED_COLLECTION, ttl=ttl)

    async def aclose(self) -> None:
        """Remove the sealed entries, then close the store."""
        try:
            await self.store.destroy_collection(SEALED_COLLECTION)
        finally:
            await self.store.aclose()


def sealed_contenders(url: str, store: Any) -> dict[str, Any]:
    """The sealed view of ``url`` as ``kvstores``, and ``store`` as the baseline."""
    return {"kvstores": SealedView(open_store(url, encryption_keys=[generate_key()])), NO_ENCRYPTION: store}
