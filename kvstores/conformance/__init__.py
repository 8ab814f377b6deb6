"""Reusable conformance suites: subclass one in your tests, or run ``kvstores check``.

- :class:`AsyncKeyValueConformance`: the key-value contract (any AsyncKeyValue).
"""

from kvstores.conformance.kv import AsyncKeyValueConformance

__all__ = ["AsyncKeyValueConformance"]
