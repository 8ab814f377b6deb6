"""A TARGET of the ``kvstores`` commands (a store URL or ``package.module:factory``), resolved once.

Beside the registry, which opens URLs: :func:`resolve` imports the factory (or opens the URL)
and one store from the target before anything runs, so that a bad target is one clear error
(:class:`TargetError`) instead of the same failure in every check or command; each check then
opens a fresh store with :meth:`Target.open`. ``kvstores check`` and the operator's commands
(ls, get, put, delete, copy, ping) use it. This module does not need pytest.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvstores._urls import redact, redact_text
from kvstores.protocol import AsyncKeyValue, capabilities, missing_methods
from kvstores.registry import open_store

__all__ = ["Target", "TargetError", "close", "is_url", "resolve"]


class TargetError(Exception):
    """A TARGET that cannot be checked; the message says why in one line, the TARGET's secrets masked."""


def is_url(target: str) -> bool:
    """True if ``target`` is a store URL rather than package.module:factory."""
    return "://" in target


@dataclass(frozen=True)
class Target:
    """A resolved TARGET: what it makes and how to make another."""

    spec: str
    """The TARGET as given."""
    make: Callable[[], Any]
    """Returns a new store (or event store), or an awaitable of one."""
    kind: str
    """"store" (an AsyncKeyValue) or "event_store" (an MCP EventStore)."""
    type_name: str
    """The qualified name of the class the target makes."""
    capabilities: frozenset[str]
    """What the store implements (:func:`kvstores.capabilities`)."""

    def __repr__(self) -> str:
        """The target with its URL redacted (pytest shows it beside a failed check)."""
        return f"Target({redact(self.spec)!r}, kind={self.kind!r}, type_name={self.type_name!r})"

    async def open(self) -> Any:
        """A new store (or event store) from the target."""
        made = self.make()
        return await made if inspect.isawaitable(made) else made


async def close(store: object) -> None:
    """Close ``store`` if it can be closed (``aclose()``, or the ``close()`` of py-key-value stores)."""
    closer = getattr(store, "aclose", None) or getattr(store, "close", None)
    if callable(closer):
        result = closer()
        if inspect.isawaitable(result):
            await result


def _factory(spec: str) -> Callable[[], Any]:
    if is_url(spec):
        return lambda: open_store(spec)
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise TargetError(
            f"{redact(spec)!r} is neither a store URL (memory://, sqlite:///file.db, ...) nor module:factory"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: modules in the working directory are found
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise TargetError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    factory = getattr(module, attribute, None)
    if not callable(factory):
        found = "nothing" if factory is None else f"a {type(factory).__name__}"
        raise TargetError(f"{redact(spec)!r} names {found}, not a factory (a callable returning a store)")
    return factory  # type: ignore[no-any-return]


async def resolve(spec: str, *, event_stores: bool = False) -> Target:
    """Resolve ``spec`` and open one store from it, or raise TargetError saying why not.

    With ``event_stores``, a factory may also return an MCP EventStore (the events suite).
    """
    make = _factory(spec)
    try:
        made = make()
        made = await made if inspect.isawaitable(made) else made
    except ImportError as exc:  # a backend's missing extra: the message names it
        raise TargetError(redact_text(str(exc), spec)) from exc
    except Exception as exc:
        doing = f"cannot open {redact(spec)}" if is_url(spec) else f"the factory {spec} raised"
        raise TargetError(f"{doing}: {type(exc).__name__}: {redact_text(str(exc), spec)}") from exc
    kind = _kind(made, event_stores)
    type_name = f"{type(made).__module__}.{type(made).__qualname__}"
    try:
        if kind == "store":
            await made.get("__kvstores_check_probe__")
    except (ConnectionError, OSError, TimeoutError) as exc:
        reason = redact_text(str(exc), spec)
        raise TargetError(f"cannot reach the store of {redact(spec)}: {type(exc).__name__}: {reason}") from exc
    except Exception:
        pass  # the checks report what else the store does wrong
    finally:
        await close(made)
    return Target(spec, make, kind, type_name, capabilities(made) if kind == "store" else frozenset())


def _kind(made: object, event_stores: bool) -> str:
    lacks = missing_methods(made, AsyncKeyValue)
    if not lacks:
        return "store"
    if event_stores:
        from mcp.server.streamable_http import EventStore

        if isinstance(made, EventStore):
            return "event_store"
    wanted = "an AsyncKeyValue store or an MCP EventStore" if event_stores else "an AsyncKeyValue store"
    raise TargetError(
        f"the factory returned a {type(made).__module__}.{type(made).__qualname__}, not {wanted}: "
        f"it has no {', '.join(f'{name}()' for name in lacks)} (a store's methods may be defined on "
        f"its class or forwarded through __getattr__)"
    )
