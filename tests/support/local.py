"""Backends that need no service: memory and SQLite files."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from kvstores.backends.memory import MemoryStore
from kvstores.backends.sqlite import SQLiteStore
from tests.support import Backend


class MemoryBackend(Backend):
    """In-process MemoryStore; every store object is its own namespace."""

    name = "memory"
    persistent = False

    async def open(self, namespace: str, **options: Any) -> MemoryStore:
        return MemoryStore(**options)


class SQLiteBackend(Backend):
    """One SQLite file per namespace in a temporary folder."""

    name = "sqlite"

    def start(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="kvstores-sqlite-"))

    def stop(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    async def open(self, namespace: str, **options: Any) -> SQLiteStore:
        return SQLiteStore(self.folder / f"{namespace}.db", **options)
