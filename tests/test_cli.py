"""`kvstores check`: runs the suite against a target and reports per group."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _check(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvstores.cli", "check", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_check_passes_on_sqlite_file(tmp_path: Path) -> None:
    result = _check(f"sqlite:///{tmp_path}/check.db", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "kvstores check sqlite:///" in result.stdout
    for group in ["basics", "bulk", "capabilities", "concurrency", "keys", "lifecycle", "ttl", "values"]:
        assert f"\n{group}" in result.stdout


def test_check_fails_on_a_broken_store_factory(tmp_path: Path) -> None:
    (tmp_path / "broken_store.py").write_text(
        "from kvstores import MemoryStore\n"
        "class Forgetful(MemoryStore):\n"
        "    async def _delete(self, collection, key):\n"
        "        return True\n"
        "def make():\n"
        "    return Forgetful()\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "kvstores.cli", "check", "broken_store:make"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert result.returncode == 1
    assert "FAILED test_basics_missing_key" in result.stdout
