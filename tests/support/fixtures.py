"""The pytest side of the backend table: marked rows, the shared fixtures, skip-or-fail.

tests/conftest.py registers this module as a plugin, so its fixtures serve every test.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, NoReturn

import pytest

import tests.support.hypothesis_profiles  # noqa: F401  # registers the "ci" (default) and "long" profiles
from tests.support import BACKENDS, Backend, Unavailable, entry_class, is_required, load, marker


def skip_or_fail(service: str, reason: str) -> NoReturn:
    """Skip for lack of ``service`` (a marker, e.g. 'redis'), or fail when KVSTORES_REQUIRE names it."""
    if is_required(service):
        pytest.fail(f"{reason} (required by KVSTORES_REQUIRE)")
    pytest.skip(reason)


@contextlib.contextmanager
def private_server(name: str) -> Iterator[Any]:
    """A private server of row ``name``'s kind (``Backend.private_server``), started, and removed after
    the block; skip, or fail when KVSTORES_REQUIRE names its service, when none can be had."""
    try:
        server = entry_class(name).private_server()
        server.init()
        server.start()
    except Unavailable as exc:
        skip_or_fail(marker(name), f"cannot start a private {name} server: {exc}")
    try:
        yield server
    finally:
        server.remove()


def rows(*names: str) -> list[Any]:
    """Rows of the table (all by default) as parameters of ``backend``, each with its marker.

    Use ``@pytest.mark.parametrize("backend", rows("redis"), indirect=True)`` to pick rows.
    """
    return [pytest.param(name, marks=getattr(pytest.mark, marker(name)), id=name) for name in names or BACKENDS]


def rows_with(*attributes: str) -> list[Any]:
    """Rows whose entry has every one of ``attributes`` true, as :func:`rows` gives them.

    A row whose driver is missing is kept: it skips (or fails, when required) when it runs.
    """
    chosen = []
    for name in BACKENDS:
        try:
            entry = entry_class(name)
        except ImportError:
            chosen.append(name)
            continue
        if all(getattr(entry, attribute) for attribute in attributes):
            chosen.append(name)
    return rows(*chosen)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def started() -> Iterator[dict[str, Backend | str]]:
    """Rows started so far in this session: name -> Backend, or the reason it is missing."""
    backends: dict[str, Backend | str] = {}
    yield backends
    for backend in backends.values():
        if isinstance(backend, Backend):
            backend.stop()


@pytest.fixture(params=rows())
def backend(request: pytest.FixtureRequest, started: dict[str, Backend | str]) -> Backend:
    """Each row of the table in turn, started once per session (skip or fail when it cannot be)."""
    return start_row(request.param, started)


def start_row(name: str, started: dict[str, Backend | str]) -> Backend:
    """Row ``name`` of the table, started once per session (``started`` is the session's fixture);
    skip, or fail when KVSTORES_REQUIRE names its service, when it cannot be had."""
    if name not in started:
        try:
            entry = load(name)
            entry.start()
            started[name] = entry
        except (Unavailable, ImportError) as exc:
            started[name] = f"{name} unavailable: {exc}"
    entry_or_reason = started[name]
    if isinstance(entry_or_reason, str):
        skip_or_fail(marker(name), entry_or_reason)
    return entry_or_reason


@pytest.fixture
async def no_signal_task_left() -> AsyncIterator[None]:
    """Fail a test that leaves a signal channel running on its loop. A store owns its channel and its
    ``aclose()`` ends the channel's tasks before it returns: a test closes the stores it opens, and
    nothing else closes a channel for it (its sockets would go to the garbage collector in a later test)."""
    yield
    running = [task for task in asyncio.all_tasks() if not task.done() and _of_signals(task)]
    assert not running, f"signal channel tasks still running after the test (a store left open?): {running}"


def _of_signals(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` runs a coroutine of kvstores.signals (a channel's or its transport's)."""
    code = getattr(task.get_coro(), "cr_code", None)
    return code is not None and "kvstores/signals/" in code.co_filename.replace("\\", "/")


@pytest.fixture
def namespace() -> str:
    """A namespace no other test uses."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def store(backend: Backend, namespace: str) -> AsyncIterator[Any]:
    """A fresh store on its own namespace, destroyed afterwards."""
    opened = await backend.open(namespace)
    yield opened
    await opened.aclose()
    cleaner = await backend.open(namespace)
    await cleaner.destroy()
    await cleaner.aclose()


@pytest.fixture
async def peer_store(backend: Backend, namespace: str, store: Any) -> AsyncIterator[Any]:
    """A second store object on the same namespace as ``store``."""
    if not backend.persistent:
        pytest.skip(f"{backend.name}: each store object has its own data")
    peer = await backend.open(namespace)
    yield peer
    await peer.aclose()


class TableStores:
    """Mixin for a conformance suite class: hands it the table's ``store`` and ``peer_store``.

    The suites declare both fixtures in the class (``store`` abstract); these overrides request
    the fixtures of the same name above, so each is defined once.
    """

    @pytest.fixture
    def store(self, store: Any) -> Any:
        """The table's store."""
        return store

    @pytest.fixture
    def peer_store(self, peer_store: Any) -> Any:
        """The table's second store object on the same namespace."""
        return peer_store


async def assert_connection_errors(
    operations: Sequence[Callable[[], Awaitable[Any]]],
    within: float,
    cause: type[BaseException] | tuple[type[BaseException], ...],
) -> None:
    """Each operation raises StoreConnectionError within ``within`` seconds, caused by ``cause``."""
    from kvstores.errors import StoreConnectionError

    for operation in operations:
        started = time.monotonic()
        with pytest.raises(StoreConnectionError) as caught:
            await operation()
        assert time.monotonic() - started < within
        assert isinstance(caught.value.__cause__, cause)
