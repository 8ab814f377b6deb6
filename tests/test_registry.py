"""open_store: built-in schemes, third-party entry points, helpful errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from kvstores import MemoryStore, open_store
from kvstores.registry import ENTRY_POINT_GROUP, SCHEMES
from tests.support import BACKENDS, Backend, marker
from tests.support.fixtures import rows, start_row


def _class_path(store: object) -> str:
    return f"{type(store).__module__}:{type(store).__qualname__}"


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_every_scheme_opens_the_class_it_names(scheme: str, tmp_path: Path) -> None:
    # SQLite's URLs name a file; every other backend's a host (stores connect lazily: none is reached)
    url = f"{scheme}:///{tmp_path}/x.db" if SCHEMES[scheme] == SCHEMES["sqlite"] else f"{scheme}://127.0.0.1/db"
    assert _class_path(open_store(url)) == SCHEMES[scheme]


def test_options_reach_the_constructor() -> None:
    assert open_store("sqlite://:memory:", timeout=1.5)._timeout == 1.5  # type: ignore[attr-defined]


def test_every_builtin_backend_has_a_row_in_the_test_table() -> None:
    """The table's markers name the backend modules, so a backend the registry opens is tested."""
    modules = {path.partition(":")[0].rpartition(".")[2] for path in SCHEMES.values()}
    assert modules == {marker(name) for name in BACKENDS}


def test_the_package_metadata_names_every_backend() -> None:
    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
    for module in {path.partition(":")[0].rpartition(".")[2] for path in SCHEMES.values()}:
        assert module in project["keywords"]
        assert module.lower() in project["description"].lower()


@pytest.mark.anyio
@pytest.mark.parametrize("name", rows())
async def test_every_row_of_the_table_opens_by_its_url(
    name: str, namespace: str, started: dict[str, Backend | str]
) -> None:
    """The URL each row's tests use opens, through the registry, the class its scheme names."""
    url, options = start_row(name, started).url(namespace)
    store = open_store(url, **options)
    try:
        assert _class_path(store) == SCHEMES[urlsplit(url).scheme]
    finally:
        await store.aclose()


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
