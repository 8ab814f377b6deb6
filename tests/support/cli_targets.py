"""py-key-value stores as ``kvstores`` CLI targets (``tests.support.cli_targets:factory``).

The operator CLI's tests copy from these in a child process, as a user moving FastMCP state
off py-key-value would. Each factory builds its store afresh (the CLI calls it twice: once
to check the target, once to use it), so the in-memory ones seed the same entries each time.
The file-tree factories read their folder from :data:`FOLDER_VARIABLE`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from key_value.aio.stores.filetree import FileTreeStore
from key_value.aio.stores.memory import MemoryStore

FOLDER_VARIABLE = "KVSTORES_TEST_FILETREE"
"""Environment variable naming the folder of the file-tree stores."""

MEMORY_ENTRIES = {"sessions": 120, "tokens": 30}
"""Collections of :func:`memory_source` and how many entries each holds."""

MEMORY_TTL = 300.0
"""TTL of every entry of :func:`memory_source`'s "tokens" collection ("sessions" never expire)."""

LONG_KEY = "k" * 2_000
"""A key py-key-value accepts and kvstores rejects (longer than 1,024 characters)."""

PAGE_ENTRIES = 10_050
"""Entries of :func:`paged_source`: more than py-key-value's MemoryStore lists (10,000)."""


def memory_value(collection: str, index: int) -> dict[str, Any]:
    """The value of entry ``index`` of ``collection`` in the seeded stores."""
    return {"collection": collection, "n": index, "big": 2**70 + index, "nested": {"list": [index, "x", None]}}


async def memory_source() -> MemoryStore:
    """py-key-value's MemoryStore holding :data:`MEMORY_ENTRIES`."""
    store = MemoryStore()
    for collection, count in MEMORY_ENTRIES.items():
        keys = [f"{collection}-{index}" for index in range(count)]
        values = [memory_value(collection, index) for index in range(count)]
        await store.put_many(keys, values, collection=collection, ttl=MEMORY_TTL if collection == "tokens" else None)
    return store


async def long_key_source() -> MemoryStore:
    """py-key-value's MemoryStore with two good entries and one under :data:`LONG_KEY`."""
    store = MemoryStore()
    await store.put_many(["good-1", LONG_KEY, "good-2"], [{"n": 1}, {"n": 2}, {"n": 3}], collection="mixed")
    return store


async def paged_source() -> MemoryStore:
    """py-key-value's MemoryStore with :data:`PAGE_ENTRIES` entries in collection "many"."""
    store = MemoryStore()
    keys = [f"key-{index}" for index in range(PAGE_ENTRIES)]
    await store.put_many(keys, [{"n": index} for index in range(PAGE_ENTRIES)], collection="many")
    return store


class ListedFileTreeStore(FileTreeStore):
    """FileTreeStore plus the listing it lacks, read from its folders (names unsanitized, the default).

    py-key-value's file stores (FileTreeStore, DiskStore) do not implement ``keys()`` or
    ``collections()``; a user moving off one gives the factory this much so that
    ``kvstores copy`` can enumerate it.
    """

    def __init__(self, folder: Path) -> None:
        super().__init__(data_directory=folder)
        self.folder = folder

    async def collections(self, *, limit: int | None = None) -> list[str]:
        """Every collection folder holding entries."""
        names = sorted(path.name for path in self.folder.iterdir() if path.is_dir() and any(path.glob("*.json")))
        return names[:limit]

    async def keys(self, collection: str | None = None, *, limit: int | None = None) -> list[str]:
        """Every key file of ``collection``."""
        folder = self.folder / (collection or self.default_collection)
        names = sorted(path.name.removesuffix(".json") for path in folder.glob("*.json")) if folder.is_dir() else []
        return names[:limit]


def filetree_listed() -> ListedFileTreeStore:
    """A :class:`ListedFileTreeStore` on the folder named by :data:`FOLDER_VARIABLE`."""
    return ListedFileTreeStore(Path(os.environ[FOLDER_VARIABLE]))


def filetree_plain() -> FileTreeStore:
    """py-key-value's FileTreeStore as it is (no listing) on the folder named by :data:`FOLDER_VARIABLE`."""
    return FileTreeStore(data_directory=os.environ[FOLDER_VARIABLE])
