"""open_store: built-in schemes, third-party entry points, helpful errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvstores import MemoryStore, open_store
from kvstores.backends.sqlite import SQLiteStore
from kvstores.registry import ENTRY_POINT_GROUP, SCHEMES


def test_builtin_schemes() -> None:
    assert isinstance(open_store("memory://"), MemoryStore)
    assert isinstance(open_store("sqlite:///x.db"), SQLiteStore)
    assert open_store("sqlite://:memory:", timeout=1.5)._timeout == 1.5  # type: ignore[attr-defined]
    assert {"memory", "sqlite", "redis", "rediss", "unix", "redis+cluster", "mongodb", "mongodb+srv"} <= set(SCHEMES)


def test_unknown_scheme_says_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"no kvstores backend for URL scheme 'nope'.*memory.*entry-point"):
        open_store("nope://x")
    with pytest.raises(ValueError, match="not a store URL"):
        open_store("just-a-path.db")


def test_missing_optional_dependency_names_the_extra() -> None:
    code = "import sys; sys.modules['aiosqlite'] = None\nimport kvstores\nkvstores.open_store('sqlite:///x.db')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode != 0
    assert 'pip install "kvstores[sqlite]"' in result.stderr


def test_third_party_scheme_through_entry_point(tmp_path: Path) -> None:
    (tmp_path / "thirdparty_kv.py").write_text(
        textwrap.dedent(
            """
            from kvstores import MemoryStore

            class ThirdPartyStore(MemoryStore):
                @classmethod
                def from_url(cls, url, **options):
                    store = cls(**options)
                    store.url = url
                    return store
            """
        )
    )
    dist = tmp_path / "thirdparty_kv-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-kv\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nthirdparty = thirdparty_kv:ThirdPartyStore\n")
    code = (
        "import kvstores; s = kvstores.open_store('thirdparty://x', max_entries=7);"
        " print(type(s).__name__, s.url, s._cache.maxsize)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path)}
    )
    assert result.stdout.split() == ["ThirdPartyStore", "thirdparty://x", "7"], result.stderr


def test_open_store_without_url_reads_kvstores_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSTORES_URL", "memory://?max_entries=7")
    store = open_store()
    assert isinstance(store, MemoryStore)
    assert store._cache.maxsize == 7


def test_open_store_without_url_or_variable_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVSTORES_URL", raising=False)
    with pytest.raises(ValueError, match=r"\$KVSTORES_URL is not set"):
        open_store()
