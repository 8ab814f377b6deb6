"""Crash safety (SQLite): a writer killed with SIGKILL at random moments never tears a batch.

A child process (tests/support/workers.py) loops ``put_many`` of 100 keys: 50 keys of its own
generation plus 50 shared keys that every batch overwrites, all with the batch's generation
number, and prints each generation once ``put_many`` has returned. It is killed 50 times,
half of them while it starts up (opening the file, creating the schema), half while it
writes. After each kill the file must pass ``PRAGMA integrity_check``, every batch must be
wholly present or wholly absent, the shared keys must all hold the newest batch, and every
acknowledged batch must be there (a process crash loses nothing committed, even with
``synchronous=NORMAL``).
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from tests.support.workers import newest_whole_batch

pytestmark = pytest.mark.sqlite

ROOT = Path(__file__).resolve().parents[1]
KILLS = 50


def _committed(path: Path) -> dict[str, dict[str, int]]:
    """Check the file's integrity; return the ``batches`` collection as key -> value."""
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'kvstores_entries'").fetchall():
            return {}  # killed before the schema was committed
        rows = db.execute("SELECT key, value FROM kvstores_entries WHERE collection = 'batches'").fetchall()
    return {key: json.loads(value) for key, value in rows}


def _acknowledged(output: str) -> list[int]:
    """Generations the child reported as written (complete lines only)."""
    return [int(line) for line in output.split("\n")[:-1]]


def test_sigkill_never_tears_a_batch(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    newest, writes_interrupted = -1, 0
    for kill in range(KILLS):
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.support.workers", "crash", f"sqlite:///{path}", str(newest + 1)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        if kill % 2:
            first = child.stdout.readline()  # let it write, then kill it mid-loop
            time.sleep(rng.uniform(0, 0.05))
        else:
            first = ""
            time.sleep(rng.uniform(0, 0.2))  # anywhere from start-up to writing
        child.kill()
        output = first + child.communicate()[0]
        assert child.returncode == -9, f"seed {seed}, kill {kill}: child exited with {child.returncode}: {output}"
        acknowledged = _acknowledged(output)
        writes_interrupted += bool(acknowledged)
        newest = newest_whole_batch(_committed(path), contiguous=True)
        assert max(acknowledged, default=-1) <= newest, f"seed {seed}, kill {kill}: an acknowledged batch was lost"
    assert writes_interrupted >= KILLS // 2, "too few kills interrupted a writing child to test anything"
