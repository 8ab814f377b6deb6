"""`kvstores bench --quick` runs end to end and writes the JSON it promises (never asserting timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvstores.bench._scenarios import KV_OPERATIONS

pytest.importorskip("rich")


def _bench(*args: str, cwd: Path) -> dict[str, Any]:
    out = cwd / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "kvstores.bench", "--quick", "--json", str(out), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "kvstores bench" in result.stdout
    document: dict[str, Any] = json.loads(out.read_text())
    return document


def _check_figures(figures: dict[str, Any]) -> None:
    assert set(figures) == {"ops_per_second", "p50_us", "p99_us", "calls"}
    assert figures["ops_per_second"] > 0
    assert figures["calls"] > 0
    assert 0 < figures["p50_us"] <= figures["p99_us"]


def test_quick_compare_on_memory(tmp_path: Path) -> None:
    document = _bench("--compare", "--no-events", "memory://", cwd=tmp_path)
    assert document["machine"]["cpu_count"] >= 1
    assert document["settings"]["compare"] is True
    rows = document["rows"]
    assert {row["operation"] for row in rows} == set(KV_OPERATIONS)
    assert {row["concurrency"] for row in rows} == {1, 64}
    for row in rows:
        assert row["target"] == "memory://"
        assert row["backend"] == "memory"
        if "skipped" in row:
            continue
        assert set(row["contenders"]) == {"kvstores", "dict+json", "py-key-value"}
        for figures in row["contenders"].values():
            _check_figures(figures)
        assert set(row["ratios"]) == {"dict+json", "py-key-value"}
        assert all(ratio > 0 for ratio in row["ratios"].values())
    labels = {target["target"] for target in document["targets"]}
    assert "MemoryStore vs py-key-value MemoryStore, 100 B" in labels
    assert all(isinstance(target["met"], bool) for target in document["targets"])


def test_quick_default_targets_with_events(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    document = _bench(cwd=tmp_path)
    rows = document["rows"]
    assert {row["target"] for row in rows} == {"memory://", "sqlite (temporary file)"}
    kv = [row for row in rows if row["group"] == "kv" and "skipped" not in row]
    assert {row["operation"] for row in kv if row["backend"] == "sqlite"} == set(KV_OPERATIONS)
    for row in kv:
        assert set(row["contenders"]) == {"kvstores"}
        assert row["ratios"] == {}
        _check_figures(row["contenders"]["kvstores"])
    events = {(row["backend"], row["operation"]) for row in rows if row["group"] == "events"}
    assert ("sqlite", "StoreEventStore.replay") in events
    assert ("memory", "InMemoryEventStore.append") in events
    assert not list(tmp_path.glob("*.db*")), "the temporary SQLite file belongs in a temporary directory"
