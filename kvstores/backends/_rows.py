"""How the SQL backends (PostgreSQL, MariaDB/MySQL) name a row: digests beside the names.

A row is ``(collection_id, key_id, collection, key)``: the SHA-256 digests of the UTF-8 names
key the table's unique index (fixed-width, whatever the names: 1,024 4-byte characters are
4 KiB, past any index's key length), and the names themselves are stored beside them and
compared too, so a digest collision can never mix two entries up.
"""

from __future__ import annotations

import hashlib
from typing import Final

VERSION_COLLECTION: Final = b""
"""The collection of the schema version's row (no kvstores collection is empty)."""
VERSION_KEY: Final = b"schema_version"
"""The key of the schema version's row."""
_CACHED: Final = 1_000
"""Collections whose (digest, name) a :class:`RowNames` keeps ready."""


def digest(name: bytes) -> bytes:
    """The 32-byte SHA-256 digest that keys ``name`` in the index."""
    return hashlib.sha256(name).digest()


def decoded(raw: bytes) -> str | None:
    """A stored name as text, or None when it is not UTF-8 (so not written by kvstores)."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return None


class RowNames:
    """The digests and UTF-8 names of rows, with the last 1,000 collections' kept ready."""

    __slots__ = ("_collections",)

    def __init__(self) -> None:
        """Nothing is kept ready yet."""
        self._collections: dict[str, tuple[bytes, bytes]] = {}

    def collection(self, collection: str) -> tuple[bytes, bytes]:
        """``(digest, UTF-8 name)`` of ``collection``."""
        ids = self._collections.get(collection)
        if ids is None:
            if len(self._collections) >= _CACHED:
                self._collections.clear()
            name = collection.encode()
            ids = self._collections[collection] = (digest(name), name)
        return ids

    def row(self, collection: str, key: str) -> tuple[bytes, bytes, bytes, bytes]:
        """``(collection_id, key_id, collection, key)``: the parameters that pick one row."""
        collection_id, name = self.collection(collection)
        encoded = key.encode()
        return collection_id, digest(encoded), name, encoded


VERSION_ROW: Final = (digest(VERSION_COLLECTION), digest(VERSION_KEY), VERSION_COLLECTION, VERSION_KEY)
"""The row that holds the table's schema version."""
