"""Reusable conformance suites: subclass one in your tests, or run ``kvstores check``.

- :class:`AsyncKeyValueConformance`: the key-value contract (any AsyncKeyValue).
- :class:`EventStoreConformance`: the MCP event-store contract (needs the ``mcp`` extra).
- :class:`SessionStateConformance`: a store behind ``FastMCP(session_state_store=...)``
  (needs the ``fastmcp`` extra).

The suites that need an optional extra are imported on first access.
"""

from __future__ import annotations

import importlib
from typing import Any

from kvstores.conformance.kv import AsyncKeyValueConformance

__all__ = ["AsyncKeyValueConformance", "EventStoreConformance", "SessionStateConformance"]

_LAZY = {
    "EventStoreConformance": "kvstores.conformance.events",
    "SessionStateConformance": "kvstores.conformance.fastmcp",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
