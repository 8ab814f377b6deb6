"""Factories ``kvstores check`` is pointed at by tests/test_check.py (as ``tests.support.check_targets:NAME``)."""

from __future__ import annotations

import inspect
from typing import Any

from kvstores import AsyncKeyValue, MemoryStore

_CORE = {name for name, value in vars(AsyncKeyValue).items() if inspect.isfunction(value) and not name.startswith("_")}


def py_key_value_memory_store() -> Any:
    """py-key-value's MemoryStore: a real store written by others, with known defects."""
    from key_value.aio.stores.memory import MemoryStore as ForeignMemoryStore

    return ForeignMemoryStore()


class CoreOnly:
    """A store with the core protocol only: no keys(), cull(), aclose(), atomic operations..."""

    def __init__(self) -> None:
        self._store = MemoryStore()

    def __getattr__(self, name: str) -> Any:
        if name in _CORE:
            return getattr(self._store, name)
        raise AttributeError(name)


def core_only() -> CoreOnly:
    """A fresh :class:`CoreOnly` store."""
    return CoreOnly()


def raising() -> Any:
    """A factory that fails."""
    raise RuntimeError("no database configured")


def not_a_store() -> Any:
    """A factory that returns something else."""
    return {"get": "not a store"}
