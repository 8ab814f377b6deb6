"""Turn a ``kvstores check`` TARGET (a store URL or ``package.module:factory``) into objects."""

from __future__ import annotations

import importlib
import inspect
import os
from typing import Any

from kvstores.registry import open_store

__all__ = ["TARGET_VARIABLE", "is_url", "open_target"]

TARGET_VARIABLE = "KVSTORES_CHECK_TARGET"
"""Environment variable through which ``kvstores check`` hands its TARGET to the suite."""


def is_url(target: str) -> bool:
    """True if ``target`` is a store URL rather than package.module:factory."""
    return "://" in target


async def open_target(target: str | None = None) -> Any:
    """Open ``target`` (default: $KVSTORES_CHECK_TARGET): a store URL, or call a factory.

    A factory is named ``package.module:callable``; it may be sync or async and returns a
    store (or, for the events suite, an event store).
    """
    target = target or os.environ[TARGET_VARIABLE]
    if is_url(target):
        return open_store(target)
    module_name, sep, attribute = target.partition(":")
    if not sep or not attribute:
        raise ValueError(f"{target!r} is neither a store URL nor package.module:factory")
    factory = getattr(importlib.import_module(module_name), attribute)
    made = factory()
    return await made if inspect.isawaitable(made) else made
