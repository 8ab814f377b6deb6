"""SQLite-specific guarantees: persistence, schema, sweeping, lock timeouts, URLs.

Several processes on one file: test_multiprocess.py; corrupt values: test_adversarial.py.
"""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from kvstores.backends.sqlite import SCHEMA_VERSION, SQLiteStore
from kvstores.errors import KVStoreError, StoreConnectionError

pytestmark = pytest.mark.anyio


def _rows(path: Path) -> int:
    with closing(sqlite3.connect(path)) as db:  # closed: Python 3.13 warns of a connection left open
        return int(db.execute("SELECT COUNT(*) FROM kvstores_entries").fetchone()[0])


async def test_reopen_keeps_values_and_remaining_ttl(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with SQLiteStore(path) as store:
        await store.put("forever", {"v": 1})
        await store.put("timed", {"v": 2}, ttl=100, collection="c")
    async with SQLiteStore(path) as store:
        assert await store.ttl("forever") == ({"v": 1}, None)
        value, remaining = await store.ttl("timed", collection="c")
        assert value == {"v": 2}
        assert remaining is not None
        assert 98 < remaining <= 100


async def test_schema_is_versioned_and_wal(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with SQLiteStore(path) as store:
        await store.put("k", {"v": 1})
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        assert db.execute("SELECT value FROM kvstores_meta WHERE name = 'schema_version'").fetchone() == (
            str(SCHEMA_VERSION),
        )
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        db.execute("UPDATE kvstores_meta SET value = '99' WHERE name = 'schema_version'")
    with pytest.raises(KVStoreError, match="schema version 99"):
        await SQLiteStore(path).get("k")


async def test_expired_rows_are_swept(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with SQLiteStore(path, sweep_interval=0) as store:
        await store.put_many([f"k{i}" for i in range(50)], [{"i": i} for i in range(50)], ttl=0.1)
        await store.put("stays", {"v": 1})
        assert _rows(path) == 51
        await asyncio.sleep(0.3)
        await store.put("trigger", {"v": 1})
        assert _rows(path) == 2
        await store.put("short", {"v": 1}, ttl=0.1)
        await asyncio.sleep(0.3)
        await store.cull()
        assert _rows(path) == 2


async def test_lock_timeout_is_a_connection_error(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with SQLiteStore(path, timeout=0.2) as store:
        await store.put("k", {"v": 1})
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            with pytest.raises(StoreConnectionError) as caught:
                await store.put("k", {"v": 2})
            assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        await store.put("k", {"v": 3})
        assert await store.get("k") == {"v": 3}


def test_url_forms() -> None:
    assert SQLiteStore.from_url("sqlite:///relative/state.db").path == "relative/state.db"
    assert SQLiteStore.from_url("sqlite:////abs/state.db").path == "/abs/state.db"
    assert SQLiteStore.from_url("sqlite://:memory:").path == ":memory:"
    assert SQLiteStore.from_url("sqlite:///with%20space.db?timeout=2")._timeout == 2.0
    with pytest.raises(ValueError, match=r"sqlite:///relative\.db"):
        SQLiteStore.from_url("sqlite://host/state.db")


async def test_opening_waits_for_a_writer_before_switching_to_wal(tmp_path: Path) -> None:
    """Switching a file to WAL does not wait on busy_timeout: a store opened while another
    connection writes to a not-yet-WAL file retries the switch instead of failing at once."""
    path = tmp_path / "busy.db"
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        writer.execute("CREATE TABLE other (x)")
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("INSERT INTO other VALUES (1)")
        asyncio.get_running_loop().call_later(0.3, writer.execute, "COMMIT")
        async with SQLiteStore(path, timeout=3) as store:
            await store.put("k", {"v": 1})
            assert await store.get("k") == {"v": 1}
    finally:
        writer.close()
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
