"""The table of backends the project's tests run against, and what each needs.

Each row is a :class:`Backend`: ``start()`` once per test session (start or reach the
service), ``open(namespace)`` a store on an isolated namespace (a fresh prefix, database
or file), ``stop()`` at the end. A backend whose service is missing is skipped, unless
``KVSTORES_REQUIRE`` (comma-separated names) names it: then its tests fail instead.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

BACKENDS = {
    "memory": "tests.support.local:MemoryBackend",
    "sqlite": "tests.support.local:SQLiteBackend",
    "redis": "tests.support.redis:RedisBackend",
    "redis-cluster": "tests.support.redis:RedisClusterBackend",
    "mongodb": "tests.support.mongodb:MongoDBBackend",
    "mongodb-motor": "tests.support.mongodb:MotorBackend",
}
"""Backend name -> "module:Class" of its test support."""


class Unavailable(Exception):
    """Raised by Backend.start() when its service cannot be had on this machine."""


class Backend:
    """How the tests reach one backend."""

    name = ""
    persistent = True
    """True when two store objects on one namespace share data (all but memory)."""

    def start(self) -> None:
        """Start or reach the service; raise Unavailable when it cannot be had."""

    def stop(self) -> None:
        """Stop what start() started."""

    async def open(self, namespace: str, **options: Any) -> Any:
        """A new store object on ``namespace``: stores on one namespace share data."""
        raise NotImplementedError


def required() -> set[str]:
    """Backends named by KVSTORES_REQUIRE (a service missing for one of these is a failure)."""
    return {name.strip() for name in os.environ.get("KVSTORES_REQUIRE", "").split(",") if name.strip()}


def is_required(name: str) -> bool:
    """True if the backend ``name`` (or its family, e.g. 'redis' for 'redis-cluster') is required."""
    wanted = required()
    return name in wanted or name.split("-")[0] in wanted


def load(name: str) -> Backend:
    """Instantiate the test support of backend ``name``."""
    module_name, _, class_name = BACKENDS[name].partition(":")
    backend: Backend = getattr(importlib.import_module(module_name), class_name)()
    return backend


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


def stop_process(process: subprocess.Popen[Any], timeout: float = 15) -> None:
    """Stop a server process: SIGTERM (a clean shutdown), then SIGKILL after ``timeout`` seconds."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class TableStores:
    """Mixin for a conformance suite class: its ``store``/``peer_store`` come from the backend table."""

    @pytest.fixture
    def store(self, backend_store: Any) -> Any:
        """The table's store (see tests/conftest.py)."""
        return backend_store

    @pytest.fixture
    def peer_store(self, backend_peer_store: Any) -> Any:
        """A second store object on the same namespace."""
        return backend_peer_store
