"""Entries of the backends that need no service: memory and SQLite files."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from kvstores.backends.memory import MemoryStore
from tests.support import Backend


class MemoryBackend(Backend):
    """In-process MemoryStore; every store object is its own namespace."""

    name = "memory"
    persistent = False
    processes = False

    def url(self, namespace: str) -> tuple[str, dict[str, Any]]:
        return "memory://", {}  # a new, empty store: nothing is shared, whatever the namespace

    async def open(self, namespace: str, **options: Any) -> MemoryStore:
        return MemoryStore(**options)

    def corrupt(self, store: Any, key: str, raw: str | bytes | int) -> None:
        if not isinstance(raw, str):
            pytest.skip("MemoryStore holds text: bytes and numbers cannot be put behind its back")
        store._cache["default", key] = (raw, None)


class SQLiteBackend(Backend):
    """One SQLite file per namespace in a temporary folder."""

    name = "sqlite"

    def start(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="kvstores-sqlite-"))

    def stop(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def url(self, namespace: str) -> tuple[str, dict[str, Any]]:
        return f"sqlite:///{self.folder / f'{namespace}.db'}", {}

    def corrupt(self, store: Any, key: str, raw: str | bytes | int) -> None:
        with closing(sqlite3.connect(store.path)) as db, db:
            db.execute("UPDATE kvstores_entries SET value = ? WHERE collection = 'default' AND key = ?", (raw, key))
