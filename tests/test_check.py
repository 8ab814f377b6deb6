"""`kvstores check` as a store author uses it: a bad target is one line, failures say why, JSON for CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvstores.conformance import TaskEngineConformance

ROOT = Path(__file__).resolve().parent.parent
TARGETS = "tests.support.check_targets"


def kvstores(*args: str, blocked: str = "", cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run the kvstores command in a child process, with the package ``blocked`` made unimportable."""
    code = (
        f"import sys; sys.modules.update(dict.fromkeys({blocked.split()!r}));"
        " from kvstores.cli import main; sys.exit(main())"
    )
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, env=environment, timeout=300
    )


def test_py_key_value_memory_store_defects_are_named(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    result = kvstores("check", f"{TARGETS}:py_key_value_memory_store", "--json", str(report))
    assert result.returncode == 1, result.stdout + result.stderr
    output = result.stdout
    assert "key_value.aio.stores.memory.store.MemoryStore; optional capabilities: collections, destroy" in output
    # an expired entry is still there until py-key-value happens to reclaim it
    assert "FAILED test_ttl_expiry_hides_everywhere [core]: AssertionError: delete() of an expired entry" in output
    # contract differences: what kvstores rejects, py-key-value stores
    assert "FAILED test_values_rejected_and_nothing_written [core]: put() of {'nan': nan} was accepted" in output
    assert "FAILED test_keys_invalid_collection_rejected [core]: put() in collection '' was accepted" in output
    # capability checks fail with the capability they need and the exception
    assert "FAILED test_capabilities_destroy_collection [needs destroy_collection]: KeyError: " in output
    assert "atomic: 15 skipped: the store has no put_if_absent(), pop(), update()" in output
    assert "lifecycle: 1 skipped: the store has no aclose()" in output
    records = json.loads(report.read_text())
    assert records["store"] == "key_value.aio.stores.memory.store.MemoryStore"
    checks = {record["check"]: record for record in records["checks"]}
    assert {"check", "group", "outcome", "reason"} <= set(checks["test_basics_delete"])
    assert checks["test_basics_delete"]["outcome"] == "passed"
    expired = checks["test_ttl_expiry_hides_everywhere"]
    assert (expired["group"], expired["outcome"]) == ("ttl", "failed")
    assert "delete() of an expired entry" in expired["reason"]
    assert checks["test_atomic_pop"]["outcome"] == "skipped"
    assert checks["test_atomic_pop"]["needs"] == ["atomic"]


def test_missing_capabilities_are_skipped_not_failed(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    result = kvstores("check", f"{TARGETS}:core_only", "--json", str(report))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "optional capabilities: none" in result.stdout
    assert "capabilities: 3 skipped: the store has no keys()" in result.stdout
    assert "capabilities: 1 skipped: the store has no destroy()" in result.stdout
    assert "ttl: 1 skipped: the store has no cull()" in result.stdout
    assert "FAILED" not in result.stdout
    outcomes = {record["outcome"] for record in json.loads(report.read_text())["checks"]}
    assert outcomes == {"passed", "skipped"}


def test_the_tasks_suite_runs_and_a_core_only_store_skips_it() -> None:
    result = kvstores("check", "memory://", "--suite", "tasks")
    assert result.returncode == 0, result.stdout + result.stderr
    checks = sum(name.startswith("test_") for name in dir(TaskEngineConformance))
    assert f"{checks - 1} passed, 0 failed, 1 skipped" in result.stdout  # one needs a second store object
    bare = kvstores("check", f"{TARGETS}:core_only", "--suite", "tasks")
    assert bare.returncode == 0, bare.stdout + bare.stderr
    assert "the store has no put_if_absent()" in bare.stdout and "FAILED" not in bare.stdout


def test_verbose_keeps_pytest_output() -> None:
    result = kvstores("check", "memory://", "-v")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "::TestKV::test_basics_missing_key PASSED" in result.stdout
    assert "kvstores check memory:// --suite kv" in result.stdout


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("no_such_module:make", "cannot import 'no_such_module': ModuleNotFoundError"),
        ("broken_module:make", "cannot import 'broken_module': ZeroDivisionError: division by zero"),
        (f"{TARGETS}:missing", f"'{TARGETS}:missing' names nothing, not a factory"),
        (f"{TARGETS}:raising", f"the factory {TARGETS}:raising raised: RuntimeError: no database configured"),
        (
            f"{TARGETS}:not_a_store",
            "the factory returned a builtins.dict, not an AsyncKeyValue store: it has no ttl(), put(), delete(), "
            "get_many(), ttl_many(), put_many(), delete_many() (a store's methods may be defined on its class or "
            "forwarded through __getattr__)",
        ),
        ("just-a-word", "is neither a store URL"),
        ("nosuch://x", "cannot open nosuch://x: ValueError: no kvstores backend for URL scheme 'nosuch'"),
        ("redis://127.0.0.1:1/0", "cannot reach the store of redis://127.0.0.1:1/0: StoreConnectionError"),
    ],
)
def test_a_bad_target_is_one_line_and_exit_2(target: str, says: str, tmp_path: Path) -> None:
    (tmp_path / "broken_module.py").write_text("1 / 0\n")
    result = kvstores("check", target, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert says in result.stderr


@pytest.mark.parametrize(
    ("suite", "blocked", "extra"),
    [
        ("fastmcp", "fastmcp", "fastmcp"),
        ("tasks", "fastmcp", "fastmcp"),
        ("events", "mcp", "mcp"),
        ("kv", "pytest", "check"),
    ],
)
def test_a_missing_extra_is_one_line_and_exit_2(suite: str, blocked: str, extra: str) -> None:
    result = kvstores("check", "--suite", suite, "memory://", blocked=blocked)
    assert result.returncode == 2
    assert (
        result.stderr
        == f'kvstores check: {blocked} is not installed; install it with: pip install "kvstores[{extra}]"\n'
    )


def test_demo_runs_without_pytest(tmp_path: Path) -> None:
    result = kvstores("demo", "--store", f"sqlite:///{tmp_path}/demo.db", blocked="pytest _pytest")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all steps showed what they should" in result.stdout
    assert "ok: the state set on server A was read back on server B" in result.stdout


def test_demo_without_fastmcp_names_the_extra() -> None:
    result = kvstores("demo", blocked="fastmcp")
    assert result.returncode == 2
    assert (
        result.stderr == 'kvstores demo: fastmcp is not installed; install it with: pip install "kvstores[fastmcp]"\n'
    )
