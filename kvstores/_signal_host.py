"""The contract between a store, its signal channel and the channel's transport, importing none of them.

A store owns its channel (:mod:`kvstores.signals`): it holds it as an :class:`OwnedChannel` and
closes it in its ``aclose()``. The channel's transport moves messages for it: the backend makes
it in ``_signal_transport(sink)``, importing its transport module there (a store that never
signals never imports one), and hands it what it needs as arguments. A transport asks its
store only what :class:`SignalHost` lists (a transport module extends it with what else its
backend offers, as :class:`SQLHost` does for a SQL server's store), through a weak reference:
a channel never keeps its store alive. So no backend and its transport import each other, and
``kvstores.base`` never imports ``kvstores.signals``: each side imports this module, which
imports neither.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import weakref
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

from kvstores.errors import KVStoreError, StoreClosedError

__all__ = ["OwnedChannel", "SQLHost", "SignalHost", "Sink", "Transport", "translated"]


@contextlib.contextmanager
def translated(translate: Callable[[Exception], KVStoreError | None]) -> Iterator[None]:
    """Translate the exceptions raised in the block with a backend's ``translate``, as its
    primitives' are: for code that talks to the backend beside them (the signal transports)."""
    try:
        yield
    except KVStoreError:
        raise
    except Exception as exc:
        error = translate(exc)
        if error is None:
            raise
        raise error from exc


class SignalHost(Protocol):
    """What every transport may ask of its store."""

    @property
    def closed(self) -> bool:
        """True once the store is closed: its transport stops reconnecting."""
        ...

    def _translate(self, exc: Exception) -> KVStoreError | None:
        """The kvstores error for the driver's ``exc`` (the store's one translation), None to let it through."""
        ...


class SQLHost(SignalHost, Protocol):
    """What a transport on a SQL server's store may ask besides: its table and a statement on its pool."""

    @property
    def table(self) -> str:
        """The store's quoted table, beside which the transport names its own."""
        ...

    async def fetch(self, sql: str, *args: Any) -> Sequence[Sequence[Any]]:
        """The rows of one statement, on the store's pool within its timeout (driver errors untranslated)."""
        ...


class OwnedChannel(Protocol):
    """What a store asks of the signal channel it owns: nothing but to close it."""

    @property
    def closed(self) -> bool:
        """True once the channel, or its store, is closed."""
        ...

    async def aclose(self) -> None:
        """End every subscription and release the transport; closing twice is fine."""
        ...


class Sink(abc.ABC):
    """What a transport calls: the channel object that owns it."""

    @abc.abstractmethod
    def deliver(self, name: str, message: str) -> None:
        """A message arrived on ``name``."""

    @abc.abstractmethod
    def gap(self) -> None:
        """Messages may have been lost, on any name."""

    @abc.abstractmethod
    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run a background task that the channel cancels when it closes."""


HostT = TypeVar("HostT", bound=SignalHost)


class Transport(abc.ABC, Generic[HostT]):
    """Moves messages between processes for one channel object; ``HostT`` is what it asks of its store.

    A backend makes its transport in ``_signal_transport(sink)``, handing it what it needs (a
    client, a path, a timeout) as arguments: the transport never reads the store's private
    attributes. It holds the store weakly (a channel never keeps its store alive), reaches it
    through :meth:`live_store` and translates the driver's errors with :meth:`translated`, the
    store's own ``_translate``.

    ``listen(name)`` returns once a message published on ``name`` afterwards will be delivered,
    or, when the backend is down, after arranging a ``sink.gap()`` for when it is back.
    Transports deliver from one task (or synchronously, in process) and never raise into it;
    their tasks stop by themselves once :attr:`store_open` is False.
    """

    def __init__(self, store: HostT, sink: Sink) -> None:
        """A transport for ``store``'s channel ``sink``."""
        self.sink = sink
        self._store = weakref.ref(store)

    @property
    def store_open(self) -> bool:
        """False once the store is closed or collected: a transport then stops reconnecting."""
        store = self._store()
        return store is not None and not store.closed

    def live_store(self) -> HostT:
        """The store; StoreClosedError once it is collected."""
        store = self._store()
        if store is None:
            raise StoreClosedError("the signal channel's store is gone")
        return store

    @contextlib.contextmanager
    def translated(self) -> Iterator[None]:
        """Raise the driver's errors in the block as the store's primitives raise them (its ``_translate``)."""
        store = self._store()
        with translated(store._translate if store is not None else _untranslated):
            yield

    @abc.abstractmethod
    async def listen(self, name: str) -> None:
        """Start receiving ``name``."""

    @abc.abstractmethod
    async def unlisten(self, name: str) -> None:
        """Stop receiving ``name``."""

    @abc.abstractmethod
    async def publish(self, name: str, message: str) -> None:
        """Send ``message`` on ``name`` to every process (this one included)."""

    async def aclose(self) -> None:
        """Release connections (the channel has cancelled the tasks it spawned)."""


def _untranslated(exc: Exception) -> None:
    """The translation once the store is gone: none."""
