"""Reusable conformance suites: subclass one in your tests, or run ``kvstores check``.

- :class:`AsyncKeyValueConformance`: the key-value contract (any AsyncKeyValue).
- :class:`EventStoreConformance`: the MCP event-store contract (needs the ``mcp`` extra).
- :class:`SessionStateConformance`: a store behind ``FastMCP(session_state_store=...)``
  (needs the ``fastmcp`` extra).
- :class:`TaskEngineConformance`: background tasks (:mod:`kvstores.tasks`) kept on a store
  (needs the ``fastmcp`` extra).

All four share one base (:mod:`kvstores.conformance._base`): they run on asyncio, and a
check of an optional capability is skipped, with the reason, on a store that does not
implement it (:func:`kvstores.capabilities`). Each suite is imported on first access, after
pytest has been told to rewrite its asserts, so a failed check shows what it saw.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["AsyncKeyValueConformance", "EventStoreConformance", "SessionStateConformance", "TaskEngineConformance"]

if TYPE_CHECKING:
    from kvstores.conformance.events import EventStoreConformance
    from kvstores.conformance.fastmcp import SessionStateConformance
    from kvstores.conformance.kv import AsyncKeyValueConformance
    from kvstores.conformance.tasks import TaskEngineConformance

_SUITES = {
    "AsyncKeyValueConformance": "kvstores.conformance.kv",
    "EventStoreConformance": "kvstores.conformance.events",
    "SessionStateConformance": "kvstores.conformance.fastmcp",
    "TaskEngineConformance": "kvstores.conformance.tasks",
}

SUITE_MODULES = tuple(_SUITES.values())
"""The modules holding the suites, whose asserts pytest rewrites."""


def __getattr__(name: str) -> Any:
    if name in _SUITES:  # pytest is imported here, not with the package: kvstores check needs none before it runs
        import pytest

        pytest.register_assert_rewrite(*SUITE_MODULES)
        return getattr(importlib.import_module(_SUITES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
