"""pytest plugin: FastMCP's own ``tests/tasks`` with kvstores' ``StoreTasks`` for ``fastmcp_tasks.TasksExtension``.

FastMCP 4.1.4's source distribution ships its test suite; its ``tests/tasks`` builds every task server
with ``TasksExtension()`` and drives ``tasks/get|update|cancel`` through ``fastmcp_tasks.handlers``.
This plugin, loaded before collection, puts :class:`DropInTasks` (a ``StoreTasks`` on a fresh store
of the backend ``KVSTORES_DROPIN_BACKEND`` names: memory, sqlite, redis or postgresql) behind both
names, and deselects the tests that read Docket's internals (:data:`DESELECTED`, each with why)::

    cd fastmcp-4.1.4   # pip download --no-binary :all: --no-deps fastmcp==4.1.4, unpacked
    KVSTORES_DROPIN_BACKEND=redis PYTHONPATH=<checkout>/tests/fastmcp_suite \\
        python -m pytest -p fastmcp_tasks_dropin -n 2 tests/tasks

``.ci/compat-matrix``'s ``fastmcp-4.1-tasks`` row runs it on the four backends. Each ``TasksExtension()``
gets a store of its own (a Redis prefix, a PostgreSQL table in a database of this run, a SQLite
file), so the workers of two servers never claim each other's tasks; every store is destroyed and
closed after its test.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

BACKENDS = ("memory", "sqlite", "redis", "postgresql")
REDIS_URL = os.environ.get("KVSTORES_DROPIN_REDIS_URL", "redis://127.0.0.1:6379/14")
POSTGRESQL_URL = os.environ.get("KVSTORES_POSTGRESQL_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

DESELECTED: dict[str, str] = {
    # FastMCP 4.1.4 tests/tasks/ node id -> why it does not apply to StoreTasks (it reads Docket or fastmcp-tasks)
    "server/test_task_ttl.py::test_poll_refreshes_routing_key_ttl": "shrinks and reads Docket's Redis routing key",
    "server/test_task_ttl.py::test_poll_refreshes_args_ttl": "shrinks and reads Docket's Redis arguments key",
    "server/test_task_ttl.py::test_poll_refreshes_snapshot_ttl": "shrinks and reads Docket's Redis snapshot key",
    "server/test_task_methods.py::test_worker_keeps_running_after_cancel_before_task_starts": "patches Docket's "
    "Execution.claim (kvstores: tests/test_tasks.py cancels a queued and a running task)",
    "server/test_task_dependencies.py::test_background_tool_receives_docket_dependency": "CurrentDocket(): Docket",
    "server/test_task_dependencies.py::test_background_tool_with_multiple_dependencies": "CurrentDocket(): Docket",
    "server/test_task_mount.py::TestMountedTaskDependencies::test_mounted_task_receives_docket_dependency": (
        "CurrentDocket()"
    ),
    "server/test_task_mount.py::TestMountedDocketOwnership::test_mounted_child_does_not_own_docket": "FastMCP.docket",
    "server/test_extension.py::test_worker_hooks_survive_sibling_server_shutdown": "fastmcp-tasks' refcount of "
    "FastMCP's worker hooks (StoreTasks installs none: its worker builds each task's context itself)",
    "server/test_extension_clone.py::test_clone_preserves_configuration_and_clears_binding[False]": "docket_settings",
    "server/test_extension_clone.py::test_clone_preserves_configuration_and_clears_binding[True]": "docket_settings "
    "and a Redis credential provider",
    "server/test_guard_reentrant.py::test_partial_update_waits_for_a_held_update_lock": "takes fastmcp-tasks' Redis "
    "update lock (kvstores: each answer is one compare-and-set on the record, no lock)",
    # fastmcp-tasks' context snapshot (a Docket key, sealed by FASTMCP_TASKS_ENCRYPTION_KEY, which StoreTasks refuses):
    # kvstores keeps the caller in the task record, sealed by the store's encryption_keys (tests/test_tasks.py,
    # tests/test_tasks_processes.py: a worker with the wrong key fails the task)
    "server/test_snapshot_encryption.py::TestEncryptedSnapshotRoundTrip::test_stored_value_is_not_readable": "reads "
    "Docket's snapshot key",
    "server/test_snapshot_encryption.py::TestEncryptedSnapshotRoundTrip::test_undecryptable_snapshot_fails_the_task": (
        "writes Docket's snapshot key"
    ),
    "server/test_snapshot_encryption.py::TestEncryptedSnapshotRoundTrip::test_missing_snapshot_fails_the_task": (
        "deletes Docket's snapshot key"
    ),
    "server/test_snapshot_encryption.py::TestEncryptedSnapshotRoundTrip::test_unparseable_snapshot_fails_the_task": (
        "patches fastmcp-tasks' TaskContextSnapshot"
    ),
    "server/test_snapshot_encryption.py::TestEncryptedSnapshotRoundTrip::test_keyless_worker_fails_the_encrypted_task": (  # noqa: E501
        "drops fastmcp-tasks' snapshot key mid-task"
    ),
    "server/test_snapshot_encryption.py::TestUnencryptedByDefault::test_snapshot_stays_plaintext_without_a_key": (
        "reads Docket's snapshot key"
    ),
    "server/test_snapshot_encryption.py::TestUnencryptedByDefault::test_unreadable_snapshot_is_nonfatal_without_a_key": (  # noqa: E501
        "writes Docket's snapshot key"
    ),
    "server/test_snapshot_encryption.py::TestTaskStillResolvesAfterFailure::test_failed_task_reports_an_error": (
        "writes Docket's snapshot key"
    ),
    "server/test_snapshot_restore.py::test_snapshot_restored_before_user_code_runs": "fastmcp-tasks' snapshot cache",
    "server/test_snapshot_restore.py::test_restore_failure_is_nonfatal": "patches fastmcp-tasks' TaskContextSnapshot",
}
"""Tests of FastMCP 4.1.4's ``tests/tasks`` that read Docket's internals, by node id under ``tests/tasks/``."""

_opened: list[Any] = []
_names = itertools.count(1)
_run = uuid.uuid4().hex[:10]
_folder: str | None = None
_database: str | None = None


def _backend() -> str:
    backend = os.environ.get("KVSTORES_DROPIN_BACKEND", "memory")
    if backend not in BACKENDS:
        raise pytest.UsageError(f"KVSTORES_DROPIN_BACKEND must be one of {', '.join(BACKENDS)}, not {backend!r}")
    return backend


def open_task_store() -> Any:
    """A new, empty store on this run's backend, closed after the test that opened it."""
    from kvstores import open_store

    backend = _backend()
    name = f"dropin_{_run}_{next(_names)}"
    if backend == "memory":
        store = open_store("memory://")
    elif backend == "sqlite":
        store = open_store(f"sqlite:///{_folder}/{name}.db")
    elif backend == "redis":
        store = open_store(REDIS_URL, prefix=f"{name}:")
    else:
        store = open_store(_database_url(), table=name)
    _opened.append(store)
    return store


def _database_url() -> str:
    base, _, _ = POSTGRESQL_URL.rpartition("/")
    return f"{base}/{_database}"


def _install() -> None:
    """``fastmcp_tasks.TasksExtension`` and the three handlers become kvstores' (before any test imports them)."""
    import fastmcp_tasks
    import fastmcp_tasks.extension
    import fastmcp_tasks.handlers
    from fastmcp.utilities.tasks import TASKS_EXTENSION_ID
    from fastmcp_tasks import models
    from mcp.shared.exceptions import MCPError
    from mcp_types import INVALID_PARAMS

    from kvstores.tasks import DEFAULT_CONCURRENCY, StoreTasks

    class DropInTasks(StoreTasks):
        """``TasksExtension(...)``'s signature over :func:`open_task_store` (Docket's options mean nothing here),
        answering ``fastmcp_tasks.models``' classes, which the tests check with isinstance: the same fields, the
        same wire (kvstores.tasks._models is a copy of them, as kvstores does not depend on fastmcp-tasks)."""

        def __init__(self, *, concurrency: int | None = None, **docket_options: Any) -> None:
            super().__init__(open_task_store(), concurrency=concurrency or DEFAULT_CONCURRENCY)

        async def _create(self, *args: Any) -> Any:
            return models.CreateTaskResult.model_validate((await super()._create(*args)).model_dump())

        async def _get(self, task_id: str) -> Any:
            return models.GetTaskResult.model_validate((await super()._get(task_id)).model_dump())

        async def _update(self, task_id: str, responses: dict[str, Any]) -> Any:
            await super()._update(task_id, responses)
            return models.UpdateTaskResult()

        async def _cancel(self, task_id: str) -> Any:
            await super()._cancel(task_id)
            return models.CancelTaskResult()

    def extension_of(server: Any, task_id: str) -> StoreTasks:
        extension = server._extensions.get(TASKS_EXTENSION_ID)
        if not isinstance(extension, StoreTasks):  # as fastmcp-tasks answers a server without its Docket
            raise MCPError(code=INVALID_PARAMS, message=f"Task {task_id} not found")
        return extension

    async def tasks_get(server: Any, task_id: str) -> Any:
        return await extension_of(server, task_id)._get(task_id)

    async def tasks_update(server: Any, task_id: str, input_responses: dict[str, Any]) -> Any:
        return await extension_of(server, task_id)._update(task_id, input_responses)

    async def tasks_cancel(server: Any, task_id: str) -> Any:
        return await extension_of(server, task_id)._cancel(task_id)

    fastmcp_tasks.TasksExtension = DropInTasks  # type: ignore[misc]
    fastmcp_tasks.extension.TasksExtension = DropInTasks  # type: ignore[misc]
    fastmcp_tasks.handlers.tasks_get = tasks_get
    fastmcp_tasks.handlers.tasks_update = tasks_update
    fastmcp_tasks.handlers.tasks_cancel = tasks_cancel


def pytest_configure(config: pytest.Config) -> None:
    """Prepare the backend (a folder for SQLite, a database for PostgreSQL) and swap the extension in."""
    global _folder, _database
    backend = _backend()
    if backend == "sqlite":
        _folder = tempfile.mkdtemp(prefix="kvstores-dropin-")
    elif backend == "postgresql":
        _database = f"kvstores_dropin_{_run}_{os.getpid()}"
        asyncio.run(_postgresql(f"CREATE DATABASE {_database}"))
    _install()
    config.addinivalue_line("markers", "kvstores_dropin: FastMCP's task tests with kvstores' StoreTasks")


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove what :func:`pytest_configure` made."""
    if _folder is not None:
        shutil.rmtree(_folder, ignore_errors=True)
    if _database is not None:
        asyncio.run(_postgresql(f"DROP DATABASE IF EXISTS {_database} WITH (FORCE)"))


async def _postgresql(statement: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(POSTGRESQL_URL)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


def pytest_report_header(config: pytest.Config) -> str:
    """Say which engine runs the tasks."""
    return f"kvstores.tasks.StoreTasks in place of fastmcp_tasks.TasksExtension, on {_backend()}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect :data:`DESELECTED`; a listed test that no longer exists is an error (the list stays true)."""
    marker = "tests/tasks/"
    chosen: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    seen: set[str] = set()
    for item in items:
        nodeid = item.nodeid.split(marker, 1)[-1]
        if nodeid in DESELECTED:
            dropped.append(item)
            seen.add(nodeid)
        else:
            chosen.append(item)
    whole_suite = [arg.rstrip("/") for arg in config.args] == ["tests/tasks"] and not config.getoption("keyword")
    if whole_suite and set(DESELECTED) - seen:
        missing = sorted(set(DESELECTED) - seen)
        raise pytest.UsageError(f"fastmcp_tasks_dropin: DESELECTED names tests that do not exist: {missing}")
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = chosen


@pytest.fixture(autouse=True)
async def _close_task_stores() -> AsyncIterator[None]:
    """Destroy and close the stores the test's extensions opened (on the test's event loop)."""
    yield
    while _opened:
        store = _opened.pop()
        try:
            if _backend() != "memory":
                await store.destroy()
        finally:
            await store.aclose()
