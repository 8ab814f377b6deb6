"""The package's shape: every third-party module kvstores imports at runtime is declared in pyproject.toml, and
the background-task engine imports without the MCP stack."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BENCH_PEERS = {
    "fastmcp_tasks": "kvstores bench --tasks runs Docket's server beside ours when fastmcp-tasks is installed (dev)",
    "mcp_persist": "kvstores bench --signals measures mcp-persist's subscribe() beside ours when installed (dev)",
    "httpx": "kvstores bench --e2e drives FastMCP's client, which takes an httpx client (dev)",
}
"""Modules only ``kvstores bench`` imports, to measure peers that the dev extra installs."""

META_PACKAGES = {"fastmcp": "fastmcp"}
"""Modules a declared meta-package provides through another distribution (fastmcp -> fastmcp-slim)."""


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra, listed in project["optional-dependencies"].items():
        if extra != "dev":
            requirements += listed
    return {_normal(re.split(r"[<>=!~\[ ;]", requirement)[0]) for requirement in requirements}


def _imports() -> dict[str, set[str]]:
    """Top-level third-party modules imported anywhere in kvstores/, with the files importing them."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / "kvstores").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "kvstores" and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_imported_package_is_declared() -> None:
    declared = _declared()
    providers = importlib.metadata.packages_distributions()
    missing = []
    for module, files in sorted(_imports().items()):
        if module in BENCH_PEERS:
            assert all(file.startswith("kvstores/bench/") for file in files), (module, files)
            continue
        if META_PACKAGES.get(module) in declared:
            continue
        distributions = {_normal(name) for name in providers.get(module, [])}
        if not distributions & declared:
            missing.append(f"{module} ({', '.join(sorted(distributions)) or 'not installed'}): {sorted(files)}")
    assert not missing, "imported but declared in no extra of pyproject.toml:\n  " + "\n  ".join(missing)


def test_the_task_engine_imports_without_the_mcp_stack(tmp_path: Path) -> None:
    """The engine, the worker and their conformance suite need a store, not FastMCP, mcp or httpx2."""
    script = textwrap.dedent(
        """
        import asyncio, sys

        class Blocked:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {"fastmcp", "mcp", "mcp_types", "httpx2", "starlette", "pydantic"}:
                    raise ImportError(f"{name} is blocked: the engine must not need it")
                return None

        sys.meta_path.insert(0, Blocked())
        from kvstores import MemoryStore
        from kvstores.conformance import TaskEngineConformance
        from kvstores.tasks import TaskEngine, Worker
        from kvstores.tasks._record import TaskState

        async def main():
            engine = TaskEngine(MemoryStore())
            record = await engine.submit(
                tool="t", version=None, arguments={}, scope=None, caller={}, poll_interval_ms=100
            )
            claim = await engine.claim(record.ref)
            assert await engine.finish(claim, TaskState.COMPLETED, result={"ok": True})
            print((await engine.read(record.id, None)).state.value)

        asyncio.run(main())
        print(TaskEngineConformance.__name__, Worker.__name__)
        """
    )
    ran = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["completed", "TaskEngineConformance", "Worker"]
