"""Fixtures shared by the project's tests: the backend table and isolated stores."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import tests.hypothesis_profiles  # noqa: F401  # registers the "ci" (default) and "long" profiles
from tests.support import BACKENDS, Backend, Unavailable, is_required, load


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def started() -> Iterator[dict[str, Backend | str]]:
    """Backends started so far in this session: name -> Backend, or the reason it is missing."""
    backends: dict[str, Backend | str] = {}
    yield backends
    for backend in backends.values():
        if isinstance(backend, Backend):
            backend.stop()


def start_backend(name: str, started: dict[str, Backend | str]) -> Backend:
    """Start backend ``name`` once per session; skip (or fail, if required) when missing."""
    if name not in started:
        try:
            backend = load(name)
            backend.start()
            started[name] = backend
        except (Unavailable, ImportError) as exc:
            started[name] = f"{name} unavailable: {exc}"
    backend_or_reason = started[name]
    if isinstance(backend_or_reason, str):
        if is_required(name):
            pytest.fail(f"{backend_or_reason} (required by KVSTORES_REQUIRE)")
        pytest.skip(backend_or_reason)
    return backend_or_reason


@pytest.fixture(params=list(BACKENDS), ids=list(BACKENDS))
def backend(request: pytest.FixtureRequest, started: dict[str, Backend | str]) -> Backend:
    """Each backend of the table in turn."""
    return start_backend(request.param, started)


@pytest.fixture
def namespace() -> str:
    """A namespace no other test uses."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def backend_store(backend: Backend, namespace: str) -> AsyncIterator[Any]:
    """A fresh store on its own namespace, destroyed afterwards."""
    opened = await backend.open(namespace)
    yield opened
    await opened.aclose()
    cleaner = await backend.open(namespace)
    await cleaner.destroy()
    await cleaner.aclose()


@pytest.fixture
async def backend_peer_store(backend: Backend, namespace: str, backend_store: Any) -> AsyncIterator[Any]:
    """A second store object on the same namespace as ``backend_store``."""
    if not backend.persistent:
        pytest.skip(f"{backend.name}: each store object has its own data")
    peer = await backend.open(namespace)
    yield peer
    await peer.aclose()


@pytest.fixture
def store(backend_store: Any) -> Any:
    """The store under test (suite classes override ``store``: they request backend_store)."""
    return backend_store


@pytest.fixture
def peer_store(backend_peer_store: Any) -> Any:
    """A second store object on the same namespace as ``store``."""
    return backend_peer_store
