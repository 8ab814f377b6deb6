"""Open a store from a URL: scheme -> "module:Class", plus third-party entry points.

Built-in schemes are listed in :data:`SCHEMES`. A third-party package adds a scheme by
declaring an entry point in the ``kvstores.backends`` group whose name is the scheme and
whose value is ``"module:Class"``; the class must offer ``from_url(url, **options)``.
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import entry_points
from typing import Any
from urllib.parse import urlsplit

from kvstores._urls import redact
from kvstores.base import BaseStore

__all__ = ["ENCRYPTION_KEYS_VARIABLE", "ENTRY_POINT_GROUP", "SCHEMES", "URL_VARIABLE", "open_store"]

URL_VARIABLE = "KVSTORES_URL"
"""Environment variable :func:`open_store` reads when it is given no URL."""

ENTRY_POINT_GROUP = "kvstores.backends"
"""Entry-point group through which other packages register URL schemes."""

SCHEMES: dict[str, str] = {
    "memory": "kvstores.backends.memory:MemoryStore",
    "sqlite": "kvstores.backends.sqlite:SQLiteStore",
    "redis": "kvstores.backends.redis:RedisStore",
    "rediss": "kvstores.backends.redis:RedisStore",
    "unix": "kvstores.backends.redis:RedisStore",
    "redis+cluster": "kvstores.backends.redis:RedisStore",
    "redis+sentinel": "kvstores.backends.redis:RedisStore",
    "mongodb": "kvstores.backends.mongodb:MongoDBStore",
    "mongodb+srv": "kvstores.backends.mongodb:MongoDBStore",
    "postgresql": "kvstores.backends.postgresql:PostgreSQLStore",
    "postgres": "kvstores.backends.postgresql:PostgreSQLStore",
    **dict.fromkeys(("mysql", "mariadb"), "kvstores.backends.mysql:MySQLStore"),
}
"""Built-in URL schemes and the store class each opens."""


def _target(scheme: str) -> str:
    if scheme in SCHEMES:
        return SCHEMES[scheme]
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        if entry_point.name == scheme:
            return entry_point.value
    known = ", ".join(sorted(SCHEMES))
    raise ValueError(
        f"no kvstores backend for URL scheme {scheme!r}; built-in schemes: {known}. "
        f"Other packages add schemes through the {ENTRY_POINT_GROUP!r} entry-point group."
    )


ENCRYPTION_KEYS_VARIABLE = "KVSTORES_ENCRYPTION_KEYS"
"""Comma-separated encryption keys (the first seals) that ``open_store`` uses when given none."""


def open_store(url: str | None = None, **options: Any) -> BaseStore:
    """Return an (unconnected) store for ``url``; ``options`` go to the store's constructor.

    Examples: ``memory://``, ``sqlite:///state.db``, ``redis://localhost:6379/0``,
    ``mongodb://localhost:27017/kvstores``. Without ``url``, the URL is read from the
    ``KVSTORES_URL`` environment variable, so a deployment switches backends without a
    code change. Likewise, without an ``encryption_keys`` option, the keys are read from
    ``KVSTORES_ENCRYPTION_KEYS`` (comma-separated, the first seals) when it is set.
    """
    if url is None:
        url = os.environ.get(URL_VARIABLE)
        if not url:
            raise ValueError(f"open_store() was given no URL and ${URL_VARIABLE} is not set")
    scheme = urlsplit(url).scheme.lower()
    if not scheme:
        raise ValueError(f"{redact(url)!r} is not a store URL (expected e.g. memory://, sqlite:///file.db)")
    module_name, _, class_name = _target(scheme).partition(":")
    store_class: type[BaseStore] = getattr(importlib.import_module(module_name), class_name)
    keys = os.environ.get(ENCRYPTION_KEYS_VARIABLE, "")
    if "encryption_keys" not in options and keys.strip():
        options["encryption_keys"] = [key.strip() for key in keys.split(",") if key.strip()]
    return store_class.from_url(url, **options)
